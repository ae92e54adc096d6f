"""How N-D logits [..., local_vocab] become the operator's 2-D strided view, without a copy.

The C++ operator reads rows of ``cols`` contiguous elements at a fixed row stride. A trainer's
logits are [batch, seq, vocab_shard] (or Megatron's [seq, batch, vocab_shard]), often a view:
a column slice, or the causal shift ``logits[:, :-1]``. Any such view whose leading dims are
non-overlapping multiples of one row stride is *covered* by one 2-D view of the caller's
buffer: row ``sum(i_k * stride_k) / row_stride`` holds token ``(i_0, i_1, ...)``. Rows of the
cover that belong to no token ("holes": the last position of each sequence for the causal
shift) lie inside the caller's storage, between its tokens; they are masked out, computed and
thrown away (one row per sequence). Only views with overlapping or too sparse rows are copied.

Which token a row is depends on the memory layout, so at TP > 1 the ranks must agree on it:
row i is merged with row i of every other rank. ``Cover.layout`` says it as text ("" when the
rows are the tokens in order, whatever the row stride), the operator's preflight compares it
across ranks, and ranks that differ read their logits again in token order (``in_token_order``:
a copy on the ranks whose rows are not the tokens in order; docs/python.md, "No copy").
"""

import hashlib
import math

import torch

# A cover with more than this many rows per token (plus slack) is copied instead: reading
# the holes would cost more than the copy.
_MAX_COVER_RATIO = 2
_COVER_SLACK = 16


class Cover:
    """The 2-D view of one N-D logits tensor.

    ``rows, row_stride``: the cover (elements); ``token_rows``: an int64 tensor mapping each
    token (in the row-major order of the leading dims) to its cover row, or None when the
    cover rows are the tokens in order; ``grad_strides``: the strides of the token view into
    a contiguous [rows, cols] gradient buffer; ``copy``: the logits must be copied first;
    ``layout``: which token each row is, as text ("" when the rows are the tokens in order).
    """

    __slots__ = ("lead_shape", "tokens", "rows", "cols", "row_stride", "token_rows",
                 "grad_strides", "copy", "layout")

    def __init__(self, lead_shape, tokens, rows, cols, row_stride, token_rows, grad_strides,
                 copy, layout=""):
        self.lead_shape = lead_shape
        self.tokens = tokens
        self.rows = rows
        self.cols = cols
        self.row_stride = row_stride
        self.token_rows = token_rows
        self.grad_strides = grad_strides
        self.copy = copy
        self.layout = layout

    @property
    def identity(self):
        return self.token_rows is None


def _layout_text(lead_shape, rows, row_steps):
    """Token (i_0, i_1, ...) of ``lead_shape`` is row sum(i_k * row_steps[k]) of ``rows``: the
    same text on two ranks means the same token in every row. At most 63 characters (the
    preflight's field): a longer text is replaced by its digest."""
    text = f"shape {list(lead_shape)} rows {rows} steps {list(row_steps)}"
    if len(text) > 63:
        text = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:48]
    return text


def _copied(lead_shape, tokens, cols):
    strides = _contiguous_strides(lead_shape, cols)
    return Cover(lead_shape, tokens, tokens, cols, cols, None, strides, copy=True)


def _contiguous_strides(lead_shape, cols):
    strides, acc = [], cols
    for n in reversed(lead_shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides)) + (1,)


def cover_of(shape, strides, copy=False):
    """The Cover of logits with this shape and these strides (elements; ``copy``: the vocab
    dim is not contiguous, so the logits must be copied whatever the leading dims)."""
    lead_shape, cols = tuple(shape[:-1]), shape[-1]
    tokens = math.prod(lead_shape)
    if copy:
        return _copied(lead_shape, tokens, cols)
    dims = [(n, s, k) for k, (n, s) in enumerate(zip(lead_shape, strides[:-1])) if n != 1]
    if not dims:
        return Cover(lead_shape, tokens, 1, cols, max(cols, 1), None,
                     _contiguous_strides(lead_shape, cols), copy=False)
    ordered = sorted(dims, key=lambda d: d[1], reverse=True)  # outermost first
    row_stride = ordered[-1][1]
    ok = row_stride >= max(cols, 1) and all(s % row_stride == 0 for _, s, _ in ordered)
    # Non-overlapping: each dim's stride spans everything inside it.
    ok = ok and all(ordered[i][1] >= ordered[i + 1][0] * ordered[i + 1][1]
                    for i in range(len(ordered) - 1))
    if not ok:
        return _copied(lead_shape, tokens, cols)
    rows = sum((n - 1) * (s // row_stride) for n, s, _ in ordered) + 1
    if rows > _MAX_COVER_RATIO * tokens + _COVER_SLACK:
        return _copied(lead_shape, tokens, cols)
    row_steps = [0] * len(lead_shape)
    for n, s, k in dims:
        row_steps[k] = s // row_stride
    grad_strides = tuple(step * cols for step in row_steps) + (1,)
    in_order = [k for _, _, k in ordered] == [k for _, _, k in dims]
    if rows == tokens and in_order:
        return Cover(lead_shape, tokens, rows, cols, row_stride, None, grad_strides, False)
    token_rows = torch.as_strided(torch.arange(rows, dtype=torch.int64), lead_shape,
                                  tuple(row_steps)).reshape(-1)
    return Cover(lead_shape, tokens, rows, cols, row_stride, token_rows, grad_strides, False,
                 _layout_text(lead_shape, rows, row_steps))


def logits_cover(shape, strides):
    """The cover ``detlogp.torch`` first reads logits of this shape and these strides through:
    an empty one when they hold no tokens, a copy when their vocab dim is not contiguous (a
    transpose), else ``cover_of`` the caller's buffer."""
    lead_shape, cols = tuple(shape[:-1]), shape[-1]
    if math.prod(lead_shape) == 0:
        return empty(lead_shape, cols)
    return cover_of(tuple(shape), tuple(strides), copy=cols > 1 and strides[-1] != 1)


def grad_strides(shape, strides):
    """The strides of the logits' gradient ``detlogp.torch`` returns (the token view of the
    [rows, cols] buffer backward fills): a function of the logits' shape and strides alone, so
    that a compiler knows them before the op runs (detlogp/_ops.py)."""
    return logits_cover(shape, strides).grad_strides


def in_token_order(cover):
    """The cover of the same logits read with rows in token order: ``cover`` itself when its
    rows already are the tokens in order, else a copy (one contiguous copy of the logits)."""
    if cover.identity:
        return cover
    return _copied(cover.lead_shape, cover.tokens, cover.cols)


def empty(lead_shape, cols):
    """The cover of logits that hold no tokens (nothing is read)."""
    return _copied(tuple(lead_shape), 0, cols)


def cover_view(x, cover):
    """The cover as a 2-D tensor view of x's storage (same data_ptr: no copy)."""
    if cover.copy:
        return x.detach().contiguous().view(cover.rows, cover.cols)
    return torch.as_strided(x.detach(), (cover.rows, cover.cols), (cover.row_stride, 1),
                            x.storage_offset())


def to_rows(values, cover, fill):
    """Per-token values (flattened, token order; [tokens] or [tokens, K]) as per-cover-row
    values (holes get fill)."""
    if cover.identity:
        return values
    out = torch.full((cover.rows,) + tuple(values.shape[1:]), fill, dtype=values.dtype)
    out[cover.token_rows] = values
    return out


def from_rows(values, cover):
    """Per-cover-row outputs as per-token outputs shaped like the leading dims."""
    if cover.identity:
        return values.view(cover.lead_shape)
    return values[cover.token_rows.to(values.device)].view(cover.lead_shape)


def row_grad(g, cover):
    """An incoming per-token gradient (None, or a tensor of the leading shape) as fp32
    per-cover-row values on the CPU (holes get 0)."""
    if g is None:
        return None
    return to_rows(g.detach().reshape(-1).to(device="cpu", dtype=torch.float32), cover, 0.0)
