"""The fused lm_head: logprobs straight from hidden states and this rank's lm_head weight shard.

    logp, lse = detlogp.fused_linear_logprobs(hidden, weight_shard, targets, group=tp_group,
                                              real_vocab=151936)
    (logp.sum() + lse.sum()).backward()   # hidden.grad and weight_shard.grad

The logits ``hidden @ weight.T`` are never held (one tile of W columns per block of rows per
thread); the outputs are bit for bit those of ``get_logprob_op(contract)`` applied to
``linear_logits(hidden, weight_shard)`` (docs/fused.md). ``hidden.grad`` is the full gradient
(the sum over the whole vocabulary, exchanged over the TP group inside the op): identical on
every rank, so it must not be all-reduced again. ``weight_shard.grad`` is this rank's shard's.
"""

import numpy as np

from . import _detlogp
from ._checks import check_bool, check_int
from ._comm import communicator_for, exclusive, fail_peers
from ._contract import LogprobContract, MaskSpec, ShardingSpec
from ._detlogp import LogprobContractError
from ._group import resolve_group
from ._op import (_grad_array, _is_tensor, _logits_view, _targets, _threads, _torch,
                  rejoin_on_layout)
from ._storage import check_stamp, stamp

__all__ = ["fused_linear_logprobs", "linear_logits", "fused_kernel_names"]


def fused_kernel_names():
    """The dense kernels of this build and CPU: "scalar-reference", "highway:<TARGET>" ..."""
    return list(_detlogp.fused_kernel_names())


def _view(x, name):
    """(address, dtype, rows, cols, row_stride) of a 2-D CPU tensor or NumPy array, no copy."""
    if _is_tensor(x) and x.device.type != "cpu":
        raise LogprobContractError(
            f"{name} must be a CPU tensor (the fused lm_head runs on the CPU); got {x.device}")
    return _logits_view(x, name, shape="")


def linear_logits(hidden, weight, *, threads=0, kernel=""):
    """The canonical fp32 logits ``hidden @ weight.T`` (docs/numerics.md, "Fused lm_head"): the
    reference the fused op is bitwise equal to, for debugging. A new fp32 tensor (torch input)
    or array (NumPy input) of shape [tokens, weight rows]."""
    hv = _view(hidden, "hidden")
    wv = _view(weight, "weight")
    if _is_tensor(hidden):
        out = _torch().empty((hv[2], wv[2]), dtype=_torch().float32)
    else:
        out = np.empty((hv[2], wv[2]), dtype=np.float32)
    _detlogp.linear_logits(hidden=hv, weight=wv, out=_view(out, "out"), threads=threads,
                           kernel=kernel)
    return out


def _check_mixed_grad(hidden, weight):
    """A NumPy array next to a torch tensor that requires grad: autograd could not reach the
    tensor through the NumPy side, and its gradient would silently never be set."""
    torch = _torch()
    if torch is None or not torch.is_grad_enabled():
        return
    for name, x, other_name, other in (("weight", weight, "hidden", hidden),
                                       ("hidden", hidden, "weight", weight)):
        if _is_tensor(x) and x.requires_grad and not _is_tensor(other):
            raise LogprobContractError(
                f"{name} is a torch tensor that requires grad but {other_name} is a NumPy "
                f"array: its gradient would never be set. Pass {other_name} as a torch tensor "
                f"(torch.from_numpy({other_name}), no copy), or {name}.detach() if no gradient "
                "is wanted")


def _default_contract(hidden_view, weight_view, targets, comm, real_vocab, tile_width,
                      temperature, ignore_index):
    """A train contract for even shards of weight rows: padded vocab = local rows x TP, active
    tokens those whose target is not ``ignore_index``."""
    tp = 1 if comm is None else comm.size
    rank = 0 if comm is None else comm.rank
    local = weight_view[2]
    padded = local * tp
    real = padded if real_vocab is None else check_int(real_vocab, "real_vocab", "positive")
    bounds = [(r * local, (r + 1) * local) for r in range(tp)]
    active = [bool(t != ignore_index) for t in targets.tolist()]
    kwargs = {} if tile_width is None else {"tile_width": tile_width}
    return LogprobContract(
        role="train", dtype=hidden_view[1],
        mask=MaskSpec(num_tokens=len(active), active_mask=active, ignore_index=ignore_index),
        sharding=ShardingSpec(tp_rank=rank, tp_world_size=tp, vocab_shard_bounds=bounds,
                              real_vocab_size=real, padded_vocab_size=padded),
        temperature=temperature, **kwargs)


def _no_tokens(hidden, weight, comm, entropy):
    """The outputs of a call without tokens, once every rank agreed that none has any: empty
    fp32 outputs; for tensors that require grad, attached to autograd with zero gradients."""
    if comm is not None and comm.size > 1:
        def call():
            _detlogp.preflight_no_tokens(comm)
        with exclusive(comm):
            rejoin_on_layout(call, call)
    n = 3 if entropy else 2
    if not _is_tensor(hidden):
        return tuple(np.zeros(0, dtype=np.float32) for _ in range(n))
    torch = _torch()
    w = weight if _is_tensor(weight) else None
    if torch.is_grad_enabled() and (hidden.requires_grad or (w is not None and w.requires_grad)):
        return _no_tokens_function().apply(hidden, w, n)
    return tuple(torch.zeros(0, dtype=torch.float32) for _ in range(n))


_NO_TOKENS = None


def _no_tokens_function():
    global _NO_TOKENS
    if _NO_TOKENS is None:
        torch = _torch()

        class NoTokens(torch.autograd.Function):
            """(hidden [0, H], weight) -> empty outputs; backward: zero gradients."""

            @staticmethod
            def forward(ctx, hidden, weight, n):
                ctx.specs = [None if t is None else (t.shape, t.dtype) for t in (hidden, weight)]
                return tuple(torch.zeros(0, dtype=torch.float32) for _ in range(n))

            @staticmethod
            def backward(ctx, *grads):
                return tuple(None if s is None else torch.zeros(s[0], dtype=s[1])
                             for s in ctx.specs) + (None,)

        _NO_TOKENS = NoTokens
    return _NO_TOKENS


def _make_function():
    torch = _torch()
    from torch.autograd.function import once_differentiable

    class FusedFunction(torch.autograd.Function):
        """(hidden, weight) -> (logp, lse[, entropy]); backward: the C++ fused backward."""

        @staticmethod
        def forward(ctx, hidden, weight, run, comm):
            handle = run(hidden, weight)
            ctx.handle, ctx.comm = handle, comm
            ctx.save_for_backward(hidden, weight)  # keeps them alive; detects in-place changes
            ctx.stamps = stamp(hidden), stamp(weight)  # detects freed storage (_storage.py)
            ctx.set_materialize_grads(False)
            outs = [torch.from_numpy(handle.logp), torch.from_numpy(handle.lse)]
            if handle.entropy is not None:
                outs.append(torch.from_numpy(handle.entropy))
            return tuple(outs)

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_logp, grad_lse, grad_entropy=None):
            hidden, weight = ctx.saved_tensors
            want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            if grad_logp is None and grad_lse is None and grad_entropy is None:
                return None, None, None, None
            check_stamp(hidden, ctx.stamps[0], "hidden")
            check_stamp(weight, ctx.stamps[1], "weight")
            gh = torch.empty_like(hidden, memory_format=torch.contiguous_format) if want_h else None
            gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if want_w else None
            with exclusive(ctx.comm):  # backward exchanges grad_hidden partials
                ctx.handle.backward(
                    grad_logp=_grad_array(grad_logp), grad_lse=_grad_array(grad_lse),
                    grad_entropy=_grad_array(grad_entropy),
                    grad_hidden=None if gh is None else _view(gh, "grad_hidden"),
                    grad_weight=None if gw is None else _view(gw, "grad_weight"))
            return gh, gw, None, None

    return FusedFunction


_FUNCTION = None


def _function():
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _make_function()
    return _FUNCTION


def fused_linear_logprobs(hidden, weight, targets, *, group=None, real_vocab=None, contract=None,
                          entropy=False, temperature=1.0, tile_width=None, ignore_index=-100,
                          validate=True, threads=0, kernel=""):
    """``(logp, lse)`` or ``(logp, lse, entropy)`` (fp32 [tokens], replicated on every TP rank)
    of ``softmax(hidden @ weight.T / temperature)`` over the real vocabulary.

    ``hidden`` [tokens, H] and ``weight`` [local_vocab, H]: this rank's rows of the lm_head, in
    bf16, fp16 or fp32 (the same dtype; CPU tensors or NumPy arrays). ``group``: the TP process
    group (torch.distributed) or a detlogp Communicator; None: inferred as in
    ``detlogp.torch`` (one rank, Megatron's TP group, or an error under torch.distributed with
    more than one rank: docs/python.md, "Which group a call runs over"). Without
    ``contract``, the shards are taken as even (padded vocab = local_vocab x TP, rank r owning
    rows [r * local_vocab, (r + 1) * local_vocab)), ``real_vocab`` (default: the padded size)
    marks the padding rows, and tokens whose target is ``ignore_index`` are inactive. With
    ``contract``, its sharding, mask, temperature and tile width are used as given.

    Torch tensors that require grad get autograd: ``hidden.grad`` (the full gradient, already
    summed over the TP group) and ``weight.grad`` (this shard's), in their own dtypes.
    Without tokens (``hidden`` [0, H]) the outputs are empty and ``weight.grad`` is zero; at
    TP > 1 every rank must then have none (checked by the preflight).
    """
    group = resolve_group(group, "fused_linear_logprobs", infer=contract is None)
    try:
        check_bool(entropy, "entropy")
        check_bool(validate, "validate")
        threads = _threads(threads, hidden)
        if not isinstance(kernel, str):
            raise LogprobContractError(f"kernel must be a string; got {type(kernel).__name__}")
        hv = _view(hidden, "hidden")
        wv = _view(weight, "weight")
        _check_mixed_grad(hidden, weight)
        tg = _targets(targets)
        no_tokens = hv[2] == 0 and len(tg) == 0 and contract is None
        if contract is None:
            comm = None if group is None else communicator_for(group, 2)
            if not no_tokens:
                contract = _default_contract(hv, wv, tg, comm, real_vocab, tile_width,
                                             temperature, ignore_index)
        elif not isinstance(contract, LogprobContract):
            raise LogprobContractError("contract must be a LogprobContract")
        if not no_tokens:
            comm = communicator_for(group, contract.sharding.tp_world_size)
    except Exception as error:  # any exception, not only contract errors: fail the peers too
        fail_peers(group, error)
        raise
    if no_tokens:
        return _no_tokens(hidden, weight, comm, entropy)

    def run(h, w):
        with exclusive(comm):
            return _detlogp.fused_forward(
                hidden=_view(h, "hidden"), weight=_view(w, "weight"), owners=(h, w),
                targets=tg, contract=contract._cpp, comm=comm, entropy=entropy,
                validate=validate, threads=threads, kernel=kernel)

    torch = _torch() if _is_tensor(hidden) else None
    if (torch is not None and torch.is_grad_enabled()
            and (hidden.requires_grad or (_is_tensor(weight) and weight.requires_grad))):
        return _function().apply(hidden, weight, run, comm)
    if torch is not None:
        hidden = hidden.detach()
        weight = weight.detach() if _is_tensor(weight) else weight
    handle = run(hidden, weight)
    convert = torch.from_numpy if torch is not None else (lambda a: a)
    outs = [convert(handle.logp), convert(handle.lse)]
    if handle.entropy is not None:
        outs.append(convert(handle.entropy))
    return tuple(outs)
