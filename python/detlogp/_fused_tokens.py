"""The fused lm_head with the calling conventions of ``detlogp.torch.vocab_parallel_logprobs``:

    logp = vocab_parallel_logprobs(hidden @ w.T, targets, ...)      # the logits path
    logp = fused_vocab_parallel_logprobs(hidden, w, targets, ...)   # the same call, fused

``hidden`` [..., H] has any leading dims (the rows of one 2-D view of its buffer, read in place
the way ``detlogp.torch`` reads N-D logits: _layout.py), ``targets`` and ``loss_mask`` its
leading shape, ``ignore_index``, per-token temperatures, ``vocab_start`` tables, ``softcap``,
``entropy``/``entropy_grad``/``return_contract`` and DTensor inputs as there (_torch_args.py
reads them for both). The call runs as the custom op ``detlogp::fused_linear_logprobs`` with
``leading_dims=True`` (_ops.py), over the same ``_FusedCall`` as ``fused_linear_logprobs``
(_fused.py): ``prepare`` below turns the N-D call into the 2-D one (cover rows, their targets,
mask and temperatures, the bounds table) and ``_TokensCall`` maps its outputs and gradients
between cover rows and tokens.

Which views are read in place: at TP = 1, any view whose cover rows hold the tokens in order,
holes allowed (a column slice, the causal shift ``hidden[:, :-1]``: its holes are masked rows
whose zero gradient adds nothing to the weight's chain over the tokens). A view whose rows hold
the tokens in another order (a transpose of the leading dims, Megatron's [s, b, H] read as [b,
s, H]) is copied into token order (tokens x H, never the logits): ``grad_weight`` is a chain
over the tokens in order, and reading the rows in memory order would change its bits. At TP > 1
row i of every rank is merged with row i of the others and the fused op's preflight does not
compare which token each row is, so every view whose rows are not exactly the tokens in order
(the causal shift included) is copied into token order.
"""

import torch

from . import _dtensor, _fused, _ops
from ._call_cache import DEFAULT_CACHE
from ._checks import check_bool, check_optional_int
from ._comm import peers_fail_on_error
from ._contract import _softcap
from ._detlogp import LogprobContractError
from ._group import resolve_group
from ._layout import cover_view, from_rows, in_token_order, logits_cover, row_grad, to_rows
from ._torch_args import (active_tokens, int_targets, op_mask, op_targets,
                          op_temperature, op_vocab_start, real_vocab_size, token_temperature,
                          vocab_bounds)

__all__ = ["fused_vocab_parallel_logprobs", "prepare"]

_NO_IGNORE = -100  # the MaskSpec's ignore_index when the caller gives none (as detlogp.torch)
_NAME = "fused_vocab_parallel_logprobs"


class _TokensCall:
    """A fused call (``_FusedCall`` or ``_NoTokensCall``) over the rows of a cover of hidden
    [..., H]: outputs per token of the leading shape, ``grad_hidden`` as a view of hidden's
    shape (strides: ``_layout.grad_strides``)."""

    constant_outputs = ()

    def __init__(self, inner, cover, rows, entropy):
        self.inner, self.cover, self.rows = inner, cover, rows  # rows: the 2-D view read
        self.outputs = 3 if entropy else 2  # logp, lse[, entropy]: the op's entropy output
        # without entropy=True is an empty placeholder, and so is its gradient
        self.contract = getattr(inner, "contract", None)  # None without tokens

    def forward(self, inputs):
        _, weight = inputs
        return tuple(from_rows(o, self.cover) for o in self.inner.forward((self.rows, weight)))

    def backward(self, inputs, grads, needs):
        _, weight = inputs
        c = self.cover
        gh, gw = self.inner.backward(
            (self.rows, weight), tuple(row_grad(g, c) for g in grads[:self.outputs]), needs)
        if gh is not None:
            gh = gh.as_strided(c.lead_shape + (c.cols,), c.grad_strides)
        return gh, gw


def _in_order(cover):
    """The cover's rows hold the tokens in order (holes between them allowed)."""
    rows = cover.token_rows
    return rows.numel() < 2 or bool((rows[1:] > rows[:-1]).all())


def prepare(hidden, weight, targets, loss_mask, group, *, real_vocab, ignore_index,
            temperature, entropy, vocab_start, threads, tile_width, softcap, validate, kernel):
    """The implementation of the op with ``leading_dims`` up to its forward: a ``_TokensCall``.
    ``temperature``: a number or a tensor of the targets' shape; ``vocab_start``: this rank's
    first row, every rank's (start, end) or None (equal shards)."""
    comm = DEFAULT_CACHE.communicator(group)
    with peers_fail_on_error(comm):
        for x, name in ((hidden, "hidden"), (weight, "weight")):
            if not isinstance(x, torch.Tensor) or x.dim() < (1 if name == "hidden" else 2):
                raise LogprobContractError(
                    f"{name} must be a torch.Tensor of shape "
                    f"{'[..., H]' if name == 'hidden' else '[local_vocab, H]'}; got "
                    f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        _fused._view(weight, "weight")  # 2-D, CPU, contiguous rows: raises, saying why
        lead, cols = tuple(hidden.shape[:-1]), weight.shape[0]
        flat_targets = int_targets(targets, lead, "the hidden states'")
        active = active_tokens(flat_targets, loss_mask, ignore_index, lead)
        ign = _NO_IGNORE if ignore_index is None else ignore_index
        tp, rank = (comm.size, comm.rank) if comm is not None else (1, 0)
        bounds, padded = vocab_bounds(vocab_start, cols, tp, rank)
        inferred = not isinstance(vocab_start, (list, tuple))
        real = real_vocab_size(real_vocab, padded, cols, tp, inferred, "weight.shape[0]")
        if tile_width is not None:
            tile_width = check_optional_int(tile_width, "tile_width", "positive")
        row_temperature = None
        if isinstance(temperature, torch.Tensor):  # one per token: the contract's is 1
            row_temperature, temperature = token_temperature(temperature, lead), 1.0
        cover = logits_cover(tuple(hidden.shape), hidden.stride())
        if cover.layout and (tp > 1 or not _in_order(cover)):  # the module docstring
            cover = in_token_order(cover)
        rows = cover_view(hidden, cover)
        row_targets = to_rows(flat_targets, cover, ign).numpy()
        row_active = to_rows(active, cover, False).numpy()
        if row_temperature is not None:  # holes get 1: any valid value (never read)
            row_temperature = to_rows(row_temperature, cover, 1.0).numpy()
    inner = _fused._prepare(
        rows, weight.detach(), row_targets, comm, real_vocab=real, contract=None,
        entropy=entropy, temperature=temperature if row_temperature is None else row_temperature,
        tile_width=tile_width, ignore_index=ign, validate=validate, threads=threads,
        kernel=kernel, bounds=bounds, softcap=softcap, active=row_active)
    return _TokensCall(inner, cover, rows, entropy)


def fused_vocab_parallel_logprobs(hidden, weight, targets, *, group=None, real_vocab=None,
                                  loss_mask=None, ignore_index=-100, temperature=1.0,
                                  entropy=False, vocab_start=None, threads=None,
                                  tile_width=None, entropy_grad=True, return_contract=False,
                                  softcap=None):
    """``vocab_parallel_logprobs(hidden @ weight.T, targets, ...)`` without the logits: the
    same arguments and outputs, from the hidden states and this rank's lm_head weight shard.

    ``hidden`` [..., H] (bf16, fp16 or fp32, CPU), any leading dims, any view whose rows are a
    fixed stride apart; read in place when its rows hold the tokens in order (the causal shift
    ``hidden[:, :-1]`` at TP = 1), else copied into token order once (tokens x H: a transpose of
    the leading dims; at TP > 1 every view whose rows are not exactly the tokens in order).
    ``weight`` [local_vocab, H]: this rank's rows of the lm_head (the hidden states' dtype; no
    bias). ``targets``: integers of hidden's leading shape. ``group``, ``real_vocab``,
    ``loss_mask``, ``ignore_index``, ``temperature`` (a number or one per token), ``entropy``,
    ``vocab_start`` (the weight rows' first vocab index, or every rank's table), ``threads``,
    ``tile_width``, ``entropy_grad``, ``return_contract`` and ``softcap``: as
    ``vocab_parallel_logprobs``: any contiguous shard bounds (vLLM's 64-padded even split
    too), the same bits as tile-aligned ones.

    Returns ``logp`` (fp32, the shape of targets), ``(logp, entropy)`` with ``entropy=True``,
    and the call's ``LogprobContract`` last with ``return_contract=True``: logp and entropy
    bit for bit those of ``vocab_parallel_logprobs(linear_logits(hidden, weight) ...)``.
    Unscored tokens get logp +0.0 and no gradient. Autograd: ``hidden.grad`` is the full
    gradient (summed over the TP group inside the op, the same bits on every rank and at every
    TP degree: do not all-reduce it again); ``weight.grad`` is this shard's.

    A DTensor ``weight`` (vocab rows ``Shard(0)``) gives the group and the bounds table; a
    DTensor ``hidden`` (Replicate on the TP dim) gives DTensor outputs (``_dtensor.py``).
    """
    if _dtensor.any_dtensor(hidden, weight, targets, loss_mask):
        if vocab_start is not None:
            raise LogprobContractError(
                f"{_NAME}: vocab_start= was given with a DTensor weight, whose mesh already "
                "says the vocab bounds; drop vocab_start= (or pass weight.to_local())")

        def local(h, w, t, *, group, bounds, **kwargs):
            return _call(h, w, t, group, vocab_start=list(bounds), **kwargs)

        return _dtensor.fused_linear_logprobs(
            local, hidden, weight, targets, group=group, contract=None, name=_NAME,
            loss_mask=loss_mask, real_vocab=real_vocab, ignore_index=ignore_index,
            temperature=temperature, entropy=entropy, threads=threads, tile_width=tile_width,
            entropy_grad=entropy_grad, return_contract=return_contract, softcap=softcap)
    group = resolve_group(group, _NAME)
    return _call(hidden, weight, targets, group, real_vocab=real_vocab, loss_mask=loss_mask,
                 ignore_index=ignore_index, temperature=temperature, entropy=entropy,
                 vocab_start=vocab_start, threads=threads, tile_width=tile_width,
                 entropy_grad=entropy_grad, return_contract=return_contract, softcap=softcap)


def _call(hidden, weight, targets, group, *, real_vocab, loss_mask, ignore_index, temperature,
          entropy, vocab_start, threads, tile_width, entropy_grad, return_contract, softcap):
    """The call over a resolved ``group``: its arguments checked and put in the op's schema
    types, then the op (what ``torch.compile`` traces)."""
    with peers_fail_on_error(group):
        check_bool(entropy, "entropy")
        check_bool(entropy_grad, "entropy_grad")
        check_bool(return_contract, "return_contract")
        for x, name in ((hidden, "hidden"), (weight, "weight")):
            if not isinstance(x, torch.Tensor):
                raise LogprobContractError(
                    f"{name} must be a torch.Tensor; got {type(x).__name__}")
            if not _ops.is_plain(x) or x.dim() < 1:
                _fused._view(x, name)  # raises, saying why
        targets = op_targets(targets, tuple(hidden.shape[:-1]), "the hidden states'")
        loss_mask = op_mask(loss_mask)
        vocab_start, bounds = op_vocab_start(vocab_start)
        scalar_temperature, token_temperatures = op_temperature(temperature)
        args = (_ops.group_name(group), check_optional_int(real_vocab, "real_vocab"), "",
                entropy, scalar_temperature, check_optional_int(tile_width, "tile_width"),
                check_optional_int(ignore_index, "ignore_index", "int"), True,
                check_optional_int(threads, "threads", "non-negative"), "", bounds,
                _softcap(softcap), token_temperatures, loss_mask, vocab_start, True)
    if return_contract and torch.compiler.is_compiling():
        raise LogprobContractError(
            "return_contract=True is not available under torch.compile: call "
            f"{_NAME} outside the compiled region for the contract")
    logp, _, ent, saved = _ops.fused_linear_logprobs(hidden, weight, targets, *args)
    if entropy and not entropy_grad:
        ent = ent.detach()  # a logged metric, without a gradient
    outputs = (logp, ent) if entropy else (logp,)
    if return_contract:
        outputs = outputs + (_ops.call_of(saved).contract,)
    return outputs[0] if len(outputs) == 1 else outputs
