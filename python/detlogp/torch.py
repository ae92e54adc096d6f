"""detlogp.torch: the functional torch API, shaped like the calls trainers already make.

    from detlogp.torch import vocab_parallel_logprobs
    logp = vocab_parallel_logprobs(logits[:, :-1], input_ids[:, 1:], group=tp_group)
    logp, entropy = vocab_parallel_logprobs(logits, targets, loss_mask=mask, entropy=True)

Any leading dims, any dtype detlogp supports (taken from the tensor), TP rank and size from
the process group, shard bounds from the local width (Megatron's equal shards) unless given,
the mask from ``loss_mask`` (bool, int or float) and/or ``targets == ignore_index``. The
contract is built internally and cached (docs/python.md). Drop-ins with the signatures of
Megatron's ``vocab_parallel_cross_entropy`` and verl's ``logprobs_from_logits``,
``vocab_parallel_log_probs_from_logits`` and entropy helpers sit on top.
``fused_vocab_parallel_logprobs(hidden, weight, targets, ...)`` is the same call from the hidden
states and the lm_head weight shard, without the logits (the fused lm_head: _fused_tokens.py).

This module is ``detlogp.torch``; inside it ``torch`` is the real torch (absolute imports).
"""

import threading

import numpy as np
import torch

from detlogp import _torch_version

_torch_version.check(torch)  # before the modules below use torch's newer API

from detlogp import _detlogp, _dtensor, _ops
from detlogp._buffers import kernel_threads, platform_of, tensor_view
from detlogp._call import LogitsCall, join_without_tokens
from detlogp._call_cache import DEFAULT_CACHE, CallCache, mask_digest
from detlogp._checks import check_bool, check_int, check_optional_int
from detlogp._comm import peers_fail_on_error
from detlogp._contract import ReductionSpec, ShardingSpec, _softcap, _temperature
from detlogp._detlogp import LogprobContractError
from detlogp._dtypes import name_of_tensor
from detlogp._fused import fused_linear_logprobs, linear_logits  # the fused lm_head (docs/fused.md)
from detlogp._fused_tokens import fused_vocab_parallel_logprobs  # its drop-in for this API
from detlogp._group import resolve_group
from detlogp._kept import (empty_kept_full, kept_argument, kept_output, outside_neg_inf,
                          row_selection,
                           selection_argument, token_kept)
from detlogp._layout import (cover_view, from_rows, in_token_order, logits_cover, row_grad,
                             to_rows)
from detlogp._op import LogprobOp, get_logprob_op
from detlogp._torch_args import (active_tokens, int_targets, op_mask, op_targets,
                                 op_temperature, op_vocab_start, real_vocab_size,
                                 token_temperature, vocab_bounds)

__all__ = ["vocab_parallel_logprobs", "vocab_parallel_cross_entropy", "logprobs_from_logits",
           "vocab_parallel_log_probs_from_logits", "vocab_parallel_entropy",
           "entropy_from_logits", "CallCache", "DEFAULT_CACHE",
           "fused_linear_logprobs", "linear_logits", "fused_vocab_parallel_logprobs"]

_REDUCTIONS = {True: ReductionSpec(), False: ReductionSpec(determinism_scope="fixed_topology")}
_NO_IGNORE = -100  # the MaskSpec's ignore_index when the caller gives none
_ONE_RANK = _detlogp.SelfComm()  # the group of calls that hold the whole vocabulary


class _Prepared:
    """One call of ``vocab_parallel_logprobs``, built before any collective: the inputs
    checked and converted once, the contract and dispatch (cached), the cover of the N-D logits
    and the ``LogitsCall`` that reads it. As the call of the custom op
    ``detlogp::vocab_parallel_logprobs`` (_ops.py) it maps logits [...,
    V_local] -> logp [...] (, entropy [...]); backward: the C++ backward into a (pooled)
    gradient buffer, returned as a view with the logits' shape."""

    __slots__ = ("call", "view", "targets", "contract", "dispatch", "cover", "comm", "threads",
                 "deterministic", "cache", "dtype", "device", "logits", "tokens", "key",
                 "make_sharding", "platform", "entropy", "entropy_grad", "fwd",
                 "constant_outputs", "token_temperature", "token_kept", "outside_neg_inf",
                 "empty_kept_full",
                 "token_top_k", "token_top_p")

    @property
    def empty(self):
        return self.cover.tokens == 0

    def run(self):
        """The forward of a call with tokens (a LogprobForward). When the ranks' rows layouts
        differ (their row i is not the same token), every rank joins the preflight once more
        with its rows in token order: a rank whose rows are not copies its logits
        (``in_token_order``)."""
        if self.call.rows_layout:
            return self.call.run(again=self._run_in_token_order)
        return self.call.run()

    def _run_in_token_order(self):
        with peers_fail_on_error(self.comm):
            _bind(self, in_token_order(self.cover))
        return self.call.run()

    def _no_outputs(self):
        """The outputs of a call without tokens (after the peers agreed that none has any)."""
        join_without_tokens(self.comm)
        logp = torch.zeros(self.cover.lead_shape, dtype=torch.float32, device=self.device)
        return (logp,) if not self.entropy else (logp, torch.zeros_like(logp))

    def forward(self, inputs):
        if self.empty:
            self.fwd = None
            return self._no_outputs()
        fwd = self.run()
        outputs = _outputs(fwd, self.cover, self.entropy)
        fwd.logp = fwd.lse = fwd.entropy = None  # kept: what backward needs
        self.fwd = fwd
        return outputs

    def backward(self, inputs, grads, needs):
        grad_logp, grad_entropy = (tuple(grads) + (None,))[:2]
        c = self.cover
        if self.fwd is None:  # no tokens: an empty gradient
            return (torch.zeros(c.lead_shape + (c.cols,), dtype=self.dtype, device=self.device),)
        out = self.cache.grad_buffer(c.rows, c.cols, self.dtype, self.device)
        self.fwd.backward(row_grad(grad_logp, c), None, row_grad(grad_entropy, c), out=out)
        return (out.as_strided(c.lead_shape + (c.cols,), c.grad_strides),)


def _prepare(logits, targets, comm, cache, *, real_vocab, loss_mask, ignore_index,
             temperature, deterministic, vocab_start, threads, tile_width, entropy,
             entropy_grad, softcap=None, kept_ids=None, outside_neg_inf=False, top_k=None,
             top_p=None, empty_kept_full=False):
    if not isinstance(logits, torch.Tensor):
        raise LogprobContractError(f"logits must be a torch.Tensor; got {type(logits).__name__}")
    platform = platform_of(logits, "logits")
    if logits.layout != torch.strided:
        raise LogprobContractError(f"logits must be a strided tensor; got {logits.layout}")
    dtype = name_of_tensor(logits, "logits")
    if logits.dim() < 1:
        raise LogprobContractError("logits must have a vocab dimension [..., local_vocab]")
    check_bool(deterministic, "deterministic")
    lead_shape, cols = tuple(logits.shape[:-1]), logits.shape[-1]
    flat_targets = int_targets(targets, lead_shape)
    active = active_tokens(flat_targets, loss_mask, ignore_index, lead_shape)
    ign = _NO_IGNORE if ignore_index is None else ignore_index

    tp, rank = (comm.size, comm.rank) if comm is not None else (1, 0)
    bounds, padded = vocab_bounds(vocab_start, cols, tp, rank)
    inferred = not isinstance(vocab_start, (list, tuple))  # equal shards of the local width
    real = real_vocab_size(real_vocab, padded, cols, tp, inferred)
    if tile_width is not None:
        tile_width = check_int(tile_width, "tile_width", "positive")
    per_token = None
    if isinstance(temperature, torch.Tensor):  # one per token: the contract's is 1
        per_token, temperature = token_temperature(temperature, lead_shape), 1.0
    temperature = _temperature(temperature)
    softcap = _softcap(softcap)

    p = _Prepared()
    p.token_temperature = per_token
    kept_argument(kept_ids, lead_shape)
    p.token_kept = None if kept_ids is None else torch.from_numpy(token_kept(kept_ids))
    p.outside_neg_inf = outside_neg_inf
    p.empty_kept_full = empty_kept_full
    p.token_top_k, p.token_top_p = selection_argument(top_k, top_p, lead_shape)
    p.logits, p.tokens = logits, (flat_targets, active, ign)
    p.key = (dtype, tp, rank, bounds, real, padded, temperature, tile_width, deterministic, ign,
             softcap)
    p.make_sharding = lambda: ShardingSpec(tp_rank=rank, tp_world_size=tp,
                                           vocab_shard_bounds=list(bounds),
                                           real_vocab_size=real, padded_vocab_size=padded)
    p.platform, p.comm, p.cache = platform, comm, cache
    p.threads = kernel_threads(threads, logits)
    p.deterministic = deterministic
    p.entropy, p.entropy_grad = entropy, entropy_grad
    # entropy_grad=False: the entropy is a logged metric, without a gradient.
    p.constant_outputs = (1,) if entropy and not entropy_grad else ()
    p.dtype, p.device = logits.dtype, logits.device
    # Not contiguous in the vocab dim (a transpose): only then are the logits copied.
    cover = logits_cover(tuple(logits.shape), logits.stride())
    if cover.tokens == 0:  # an empty micro-batch: empty outputs, nothing to read
        p.cover, p.contract = cover, None
        return p
    _bind(p, cover)
    if cover.layout and tp > 1 and not isinstance(p.dispatch.op, LogprobOp):
        _bind(p, in_token_order(cover))  # a Python-defined backend cannot compare layouts
    return p


def _bind(p, cover):
    """The rows of a call read through ``cover``: the contract (cached), dispatch, the view,
    the per-row targets and the ``LogitsCall`` of a backend defined in C++."""
    flat_targets, active, ign = p.tokens
    row_targets = to_rows(flat_targets, cover, ign)
    row_active = to_rows(active, cover, False)
    (dtype, tp, rank, bounds, real, padded, temperature, tile_width, deterministic,
     ign, softcap) = p.key
    all_active = bool(row_active.all())
    active_bytes = row_active.numpy().view(np.uint8)
    mask_key = None if all_active else mask_digest(active_bytes)
    base_key = (cover.rows,) + p.key
    contract = p.cache.contract(base_key + (mask_key,), active_bytes, ign, p.make_sharding,
                                dtype, temperature, tile_width, _REDUCTIONS[deterministic],
                                softcap)
    p.dispatch = p.cache.op(base_key + (all_active, p.platform),
                            lambda: get_logprob_op(contract, "auto", platform=p.platform))
    p.contract, p.cover = contract, cover
    p.view = cover_view(p.logits, cover)
    p.targets = row_targets.numpy()
    op = p.dispatch.op
    if not isinstance(op, LogprobOp):  # defined in Python: called on the view itself
        if p.token_temperature is not None:
            raise LogprobContractError(
                f"backend {p.dispatch.actual_backend} (defined in Python) takes no per-token "
                "temperature; pass temperature as a number")
        if p.token_kept is not None:
            raise LogprobContractError(
                f"backend {p.dispatch.actual_backend} (defined in Python) takes no kept_ids; "
                "call without kept_ids, or dispatch a backend defined in C++")
        if p.token_top_k is not None or p.token_top_p is not None:
            raise LogprobContractError(
                f"backend {p.dispatch.actual_backend} (defined in Python) takes no top_k / "
                "top_p; call without them, or dispatch a backend defined in C++")
        p.call = None
        return
    # Rows that are no token (holes in the cover) get 1: any valid value (their outputs are
    # never read).
    row_temperature = None if p.token_temperature is None else \
        to_rows(p.token_temperature, cover, 1.0).numpy()
    # Rows that are no token get an empty set (-1 only): they are inactive.
    kept_rows = None if p.token_kept is None else to_rows(p.token_kept, cover, -1).numpy()
    top_k_rows, top_p_rows = row_selection(p.token_top_k, p.token_top_p, cover, to_rows)
    # The rows layout matters to the preflight only (TP > 1); a Python-defined backend never
    # gets one (its rows are read in token order: _prepare).
    # entropy_grad=False: the operator keeps no entropy for backward (a constant).
    p.call = LogitsCall(
        cpp=op._cpp, backend_id=op.backend_id, platform=p.platform, logits=p.view,
        view=tensor_view(p.view, dtype), targets=p.targets, contract=contract, comm=p.comm,
        deterministic=deterministic, validate=True, entropy=p.entropy,
        entropy_grad=p.entropy_grad or not p.entropy, threads=p.threads,
        rows_layout=cover.layout if tp > 1 else "", row_temperature=row_temperature,
        kept_ids=kept_rows, outside_neg_inf=p.outside_neg_inf, top_k=top_k_rows,
        top_p=top_p_rows, empty_kept_full=p.empty_kept_full)


def _outputs(fwd, cover, entropy):
    logp = from_rows(fwd.logp, cover)
    if not entropy:
        return (logp,)
    return logp, from_rows(fwd.entropy, cover)


def _python_backend_outputs(prep, logits, group, entropy, entropy_grad):
    """A backend defined in Python (docs/python.md, "Registering backends from Python") is
    called on the operator's 2-D view of the logits as ``forward(view, target_ids,
    contract=contract, group=group)`` (plus ``entropy=True`` when asked) and returns ``(logp,
    lse)`` or ``(logp, lse, entropy)``: tensors of one value per row. Its own autograd graph
    carries the gradient back to the logits; detlogp never calls its ``backward``."""
    c = prep.cover
    if c.copy:
        view = logits.contiguous().view(c.rows, c.cols)
    else:  # cover_view without the detach: the same memory, attached to autograd
        view = torch.as_strided(logits, (c.rows, c.cols), (c.row_stride, 1),
                                logits.storage_offset())
    kwargs = {"contract": prep.contract, "group": group}
    if entropy:
        kwargs["entropy"] = True
    dispatch = prep.dispatch
    out = dispatch.op.forward(view, torch.from_numpy(prep.targets), **kwargs)
    want = 3 if entropy else 2
    if not (isinstance(out, (tuple, list)) and len(out) == want
            and all(isinstance(o, torch.Tensor) and tuple(o.shape) == (c.rows,) for o in out)):
        got = [tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
               for o in (out if isinstance(out, (tuple, list)) else [out])]
        raise RuntimeError(
            f"backend {dispatch.actual_backend} (defined in Python) returned {got} from "
            f"forward; detlogp.torch expects {want} tensors of shape ({c.rows},): logp, lse"
            + (", entropy" if entropy else ""))
    logp = from_rows(out[0].float(), c)
    if not entropy:
        return (logp,)
    ent = out[2].float()
    return logp, from_rows(ent if entropy_grad else ent.detach(), c)


def vocab_parallel_logprobs(logits, targets, *, group=None, real_vocab=None, loss_mask=None,
                            ignore_index=-100, temperature=1.0, entropy=False,
                            deterministic=True, vocab_start=None, threads=None,
                            tile_width=None, entropy_grad=True, return_contract=False,
                            cache=None, softcap=None, kept_ids=None, outside_kept="error",
                            top_k=None, top_p=None, return_kept=False, empty_kept="error"):
    """Selected-token log-probabilities over a vocab-sharded (TP) vocabulary, bit-for-bit the
    same at every TP degree, with autograd.

    ``logits``: this rank's shard [..., local_vocab] (bf16, fp16 or fp32; CPU or CUDA), any
    leading dims, any view whose rows are a fixed stride apart (a column slice, the causal
    shift ``logits[:, :-1]``, Megatron's [seq, batch, v/tp]): read in place, never copied.
    ``targets``: integers with the leading shape. ``group``: the TP process group or a
    Communicator (``detlogp.SelfComm()``: one rank holding the whole vocabulary); None:
    inferred (Megatron's TP group, or one rank; raises under torch.distributed with more than
    one rank: docs/python.md, "Which group a call runs over"). Ranks may hold their logits in
    different layouts; logits without tokens give empty outputs. ``real_vocab``: the real
    vocabulary size (default: all ``local_vocab * tp`` columns; columns at or beyond it are
    padding and never count).
    ``loss_mask`` (bool/int/float, the leading shape; nonzero = scored) and ``ignore_index``
    (targets equal to it are not scored; None: no such rule) give the mask: unscored tokens
    get logp exactly +0.0. ``vocab_start``: this rank's first column (checked against equal
    shards) or the full table [(start, end), ...]; default: equal shards. ``threads``: kernel
    threads (default ``torch.get_num_threads()``; the bits never depend on it).
    ``entropy_grad=False`` returns the entropy without a gradient (non-differentiable).
    ``softcap`` (None: no cap): scores use ``softcap * tanh(logits / softcap) / temperature``,
    the logit softcap of Gemma-class models (in the contract and its fingerprint).
    ``temperature``: a number, or a floating-point tensor of the targets' shape giving each
    token its own (finite, > 0; no gradient flows to it): a token gets the bits of a call
    whose temperature is its own (docs/numerics.md, "Per-row temperature").
    ``kept_ids`` (None: the full vocabulary): sampling-replay kept sets, an int32/int64 tensor
    of the targets' shape plus a last dimension K (each token's kept vocabulary ids, any order,
    -1 padded, K <= 1024): logp and entropy are then over each token's kept set S (``logp =
    z[target] - logsumexp_S(z)``, docs/numerics.md "Kept sets") and the gradient flows only into
    kept columns. ``outside_kept``: "error" (a target outside its set raises) or "neg_inf"
    (its logp is -inf, with no gradient). ``empty_kept``: "error" (an active token whose ids
    are all -1 raises) or "full" (such a token is scored over the full vocabulary, the bits of
    the call without ``kept_ids``: a rollout batch's unrestricted rows, ``detlogp.sample``'s
    ``kept`` handed back whole).
    ``top_k`` / ``top_p`` (None: off): recomputed kept sets, the sampler's parameters as an int
    (``top_k``: 0 off, else 1 .. 1024) / a number (``top_p``: in (0, 1], 1 off), or tensors of
    the targets' shape (one per token): each token's kept set is recomputed from its scored
    logits (docs/numerics.md "Recomputed kept sets (top-k, top-p)"), the same set at every TP
    degree, then scored as with ``kept_ids``. Not together with ``kept_ids``. Tokens may mix: an
    unrestricted token (``top_k`` 0 and ``top_p`` 1) is scored over the full vocabulary (the bits
    of the call without kept sets, gradient included), the others over their kept sets.
    ``return_kept=True`` appends the call's kept sets: int64 ``[..., width]`` (each token's ids
    ascending, -1 padded; width 0 without kept sets). Eager only (not under torch.compile).

    Returns ``logp`` (fp32, the shape of targets), ``(logp, entropy)`` with ``entropy=True``,
    and the ``LogprobContract`` of the call as a last element with ``return_contract=True``.

    DTensor ``logits`` (vocab ``Shard(-1)`` on a DeviceMesh dim): the group and the
    ``vocab_start`` table come from the mesh, the outputs are DTensors (``_dtensor.py``).
    """
    if _dtensor.any_dtensor(logits, targets, loss_mask):
        if top_k is not None or top_p is not None or return_kept or empty_kept != "error":
            raise LogprobContractError(
                "top_k, top_p, empty_kept and return_kept are not available with DTensor "
                "logits; pass the local shards and the group")
        return _dtensor.vocab_parallel_logprobs(
            vocab_parallel_logprobs, logits, targets, group=group, vocab_start=vocab_start,
            loss_mask=loss_mask, real_vocab=real_vocab, ignore_index=ignore_index,
            temperature=temperature, entropy=entropy, deterministic=deterministic,
            threads=threads, tile_width=tile_width, entropy_grad=entropy_grad,
            return_contract=return_contract, cache=cache, softcap=softcap, kept_ids=kept_ids,
            outside_kept=outside_kept)
    group = resolve_group(group, "vocab_parallel_logprobs")
    return _logprobs(logits, targets, group, real_vocab=real_vocab, loss_mask=loss_mask,
                     ignore_index=ignore_index, temperature=temperature, entropy=entropy,
                     deterministic=deterministic, vocab_start=vocab_start, threads=threads,
                     tile_width=tile_width, entropy_grad=entropy_grad,
                     return_contract=return_contract, cache=cache, softcap=softcap,
                     kept_ids=kept_ids, outside_kept=outside_kept, top_k=top_k, top_p=top_p,
                     return_kept=return_kept, empty_kept=empty_kept)


def _logprobs(logits, targets, group, *, real_vocab, loss_mask, ignore_index, temperature,
              entropy, deterministic, vocab_start, threads, tile_width, entropy_grad,
              return_contract, cache, softcap, kept_ids, outside_kept, top_k=None, top_p=None,
              return_kept=False, empty_kept="error"):
    """``vocab_parallel_logprobs`` over a resolved ``group``: its arguments checked and put
    in the op's schema types, then the op ``detlogp::vocab_parallel_logprobs`` (_ops.py), whose
    implementation is ``_op_call``. This is what ``torch.compile`` traces."""
    with peers_fail_on_error(group):
        check_bool(entropy, "entropy")
        check_bool(entropy_grad, "entropy_grad")
        check_bool(return_contract, "return_contract")
        check_bool(return_kept, "return_kept")
        if not isinstance(logits, torch.Tensor):
            raise LogprobContractError(
                f"logits must be a torch.Tensor; got {type(logits).__name__}")
        platform_of(logits, "logits")  # a meta tensor would run the op's fake implementation
        if logits.layout != torch.strided:
            raise LogprobContractError(f"logits must be a strided tensor; got {logits.layout}")
        check_bool(deterministic, "deterministic")
        targets = op_targets(targets, tuple(logits.shape[:-1]))
        loss_mask = op_mask(loss_mask)
        if cache is not None and not isinstance(cache, CallCache):
            raise LogprobContractError(
                f"cache must be a detlogp.torch.CallCache or None; got {type(cache).__name__}")
        vocab_start, bounds = op_vocab_start(vocab_start)
        scalar_temperature, token_temperatures = op_temperature(temperature)
        args = (
            _ops.group_name(group), check_optional_int(real_vocab, "real_vocab"),
            check_optional_int(ignore_index, "ignore_index", "int"), scalar_temperature,
            entropy, deterministic, vocab_start, bounds,
            check_optional_int(threads, "threads", "non-negative"),
            check_optional_int(tile_width, "tile_width"), entropy_grad,
            "" if cache is None else cache.op_name, _softcap(softcap), token_temperatures,
            kept_argument(kept_ids, tuple(logits.shape[:-1])), outside_neg_inf(outside_kept),
            *selection_argument(top_k, top_p, tuple(logits.shape[:-1])),
            empty_kept_full(empty_kept))
    if torch.compiler.is_compiling():
        if return_kept:
            raise LogprobContractError(
                "return_kept=True is not available under torch.compile: call "
                "vocab_parallel_logprobs outside the compiled region for the kept sets")
        if return_contract:
            raise LogprobContractError(
                "return_contract=True is not available under torch.compile: call "
                "vocab_parallel_logprobs outside the compiled region for the contract")
        logp, ent, _ = _ops.vocab_parallel_logprobs(logits, targets, loss_mask, *args)
        contract = None
    else:
        try:
            logp, ent, saved = _ops.vocab_parallel_logprobs(logits, targets, loss_mask, *args)
            if return_kept:
                kept = _kept_of(_ops.call_of(saved), logits.device)
        except _PythonDefined as defined:  # a backend defined in Python: its own autograd
            outputs = _python_backend_outputs(defined.prep, logits, group, entropy,
                                              entropy_grad)
            logp, ent = outputs[0], outputs[-1]
            if return_kept:  # such a backend takes no kept sets
                kept = kept_output(None, defined.prep.cover, logits.device)
        contract = _LAST.contract
    if entropy and not entropy_grad:
        ent = ent.detach()  # a logged metric, without a gradient
    outputs = (logp, ent) if entropy else (logp,)
    if return_kept:
        outputs = outputs + (kept,)
    if return_contract:
        outputs = outputs + (contract,)
    return outputs[0] if len(outputs) == 1 else outputs


def _kept_of(call, device):
    """The kept sets of an eager call (return_kept=True), per token."""
    ids = None if call.fwd is None else call.fwd.kept_ids
    return kept_output(ids, call.cover, device)


class _PythonDefined(LogprobContractError):
    """The op's call dispatched to a backend defined in Python: the eager caller runs it on the
    logits themselves (``_python_backend_outputs``), attached to autograd by the backend; in a
    torch.compile graph it cannot run (this error says so)."""

    def __init__(self, prep):
        super().__init__(
            f"backend {prep.dispatch.actual_backend} is defined in Python: it cannot run inside "
            "a torch.compile graph; call vocab_parallel_logprobs outside the compiled region")
        self.prep = prep


class _Last(threading.local):
    contract = None


_LAST = _Last()  # the contract of this thread's last call (return_contract=True)


def _op_call(logits, targets, loss_mask, group, real_vocab, ignore_index, temperature, entropy,
             deterministic, vocab_start, vocab_bounds, threads, tile_width, entropy_grad,
             cache, softcap, row_temperature, kept_ids=None, outside_neg_inf=False, top_k=None,
             top_p=None, empty_kept_full=False):
    """The implementation of the op ``detlogp::vocab_parallel_logprobs`` up to its forward: the
    ``_Prepared`` call (checked, converted, bound to its contract and dispatch)."""
    cache = DEFAULT_CACHE if not cache else _ops.named(cache)
    comm = cache.communicator(_ops.group_of(group))
    if row_temperature is not None:  # one per token (the op's scalar is then 1)
        temperature = row_temperature
    if vocab_bounds is not None:
        vocab_start = list(zip(vocab_bounds[::2], vocab_bounds[1::2]))
    with peers_fail_on_error(comm):
        prep = _prepare(logits, targets, comm, cache, real_vocab=real_vocab,
                        loss_mask=loss_mask, ignore_index=ignore_index,
                        temperature=temperature, deterministic=deterministic,
                        vocab_start=vocab_start, threads=threads, tile_width=tile_width,
                        entropy=entropy, entropy_grad=entropy_grad, softcap=softcap,
                        kept_ids=kept_ids, outside_neg_inf=outside_neg_inf, top_k=top_k,
                        top_p=top_p, empty_kept_full=empty_kept_full)
    _LAST.contract = prep.contract
    if not prep.empty and prep.call is None:
        raise _PythonDefined(prep)
    return prep


# --- drop-ins ----------------------------------------------------------------------------


def vocab_parallel_cross_entropy(vocab_parallel_logits, target, label_smoothing=0.0,
                                 tp_group=None, *, group=None, real_vocab=None, ignore_index=-100,
                                 threads=None):
    """Megatron's ``tensor_parallel.vocab_parallel_cross_entropy``: per-token loss ``-logp``
    (fp32, the shape of ``target``) of ``vocab_parallel_logits`` [s, b, v/tp], deterministic.

    ``tp_group`` (Megatron's name) or ``group``: the TP group (default: Megatron's
    tensor-model-parallel group when megatron is initialized; the rule of
    ``vocab_parallel_logprobs``). Differences: ``label_smoothing`` must be 0; targets equal to
    ``ignore_index`` get loss 0 (Megatron gives them a meaningless value).
    """
    if label_smoothing != 0.0:
        raise LogprobContractError(
            f"label_smoothing={label_smoothing} is not supported: detlogp computes the "
            "selected-token logprob only; pass label_smoothing=0.0")
    if tp_group is not None and group is not None and tp_group is not group:
        raise LogprobContractError(
            "vocab_parallel_cross_entropy: tp_group= and group= name two different groups; "
            "pass the TP group once, as tp_group= (Megatron's name) or group=")
    if not _dtensor.is_dtensor(vocab_parallel_logits):  # a DTensor's mesh says its group
        group = resolve_group(group if group is not None else tp_group,
                              "vocab_parallel_cross_entropy")
    logp = vocab_parallel_logprobs(vocab_parallel_logits, target, group=group,
                                   real_vocab=real_vocab, ignore_index=ignore_index,
                                   threads=threads)
    return -logp


def vocab_parallel_log_probs_from_logits(logits, labels, *, group=None, real_vocab=None,
                                         ignore_index=-100, threads=None):
    """verl's Megatron helper of the same name: ``-vocab_parallel_cross_entropy``."""
    if not _dtensor.is_dtensor(logits):  # a DTensor's mesh says its group
        group = resolve_group(group, "vocab_parallel_log_probs_from_logits")
    return vocab_parallel_logprobs(logits, labels, group=group, real_vocab=real_vocab,
                                   ignore_index=ignore_index, threads=threads)


def logprobs_from_logits(logits, labels, inplace_backward=True, *, real_vocab=None,
                         ignore_index=-100, threads=None):
    """verl's ``logprobs_from_logits``: log-probabilities of ``labels`` under ``logits``
    [..., vocab] (one rank, the whole vocabulary), fp32, the shape of ``labels``.

    ``inplace_backward`` is accepted for the signature: detlogp never writes into the logits;
    its gradient goes into a pooled buffer (docs/python.md).
    """
    check_bool(inplace_backward, "inplace_backward")
    one_rank = None if _dtensor.is_dtensor(logits) else _ONE_RANK  # DTensor: the mesh's
    return vocab_parallel_logprobs(logits, labels, group=one_rank, real_vocab=real_vocab,
                                   ignore_index=ignore_index, threads=threads)


def _entropy(logits, group, real_vocab, threads):
    """The entropy output of ``vocab_parallel_logprobs`` for every token of ``logits`` (the
    targets, column 0 of every row, only select a logp that is not returned)."""
    lead = tuple(logits.shape[:-1]) if isinstance(logits, torch.Tensor) and logits.dim() else ()
    targets = torch.zeros(lead, dtype=torch.int64)
    return vocab_parallel_logprobs(logits, targets, group=group, real_vocab=real_vocab,
                                   ignore_index=None, entropy=True, threads=threads)[1]


def vocab_parallel_entropy(vocab_parallel_logits, *, group=None, real_vocab=None, threads=None):
    """verl's ``utils.megatron.tensor_parallel.vocab_parallel_entropy``: the entropy of every
    token (fp32, the leading shape of ``vocab_parallel_logits`` [..., v/tp]), differentiable,
    bitwise equal at every TP degree. ``group``: as in ``vocab_parallel_cross_entropy``."""
    group = resolve_group(group, "vocab_parallel_entropy")
    return _entropy(vocab_parallel_logits, group, real_vocab, threads)


def entropy_from_logits(logits, *, real_vocab=None, threads=None):
    """verl's ``utils.torch_functional.entropy_from_logits``: the entropy of every token of
    ``logits`` [..., vocab] (one rank, the whole vocabulary), fp32, differentiable."""
    return _entropy(logits, _ONE_RANK, real_vocab, threads)


def __dir__():
    """The public API only (``__all__``); the module's imports and helpers stay out of sight."""
    return sorted(__all__)
