"""The fused lm_head: logprobs straight from hidden states and this rank's lm_head weight shard.

    logp, lse = detlogp.fused_linear_logprobs(hidden, weight_shard, targets, group=tp_group,
                                              real_vocab=151936)
    (logp.sum() + lse.sum()).backward()   # hidden.grad and weight_shard.grad

The logits ``hidden @ weight.T`` are never held (one tile of W columns per block of rows per
thread); the outputs are bit for bit those of ``get_logprob_op(contract)`` applied to
``linear_logits(hidden, weight_shard)`` (docs/fused.md). ``hidden.grad`` is the full gradient
(the sum over the whole vocabulary, exchanged over the TP group inside the op): identical on
every rank, so it must not be all-reduced again. ``weight_shard.grad`` is this rank's shard's.

``detlogp.torch.fused_vocab_parallel_logprobs`` (hidden [..., H] with the conventions of
``vocab_parallel_logprobs``: _fused_tokens.py) runs through the same ``_prepare``, ``_FusedCall``
and custom op.
"""

import numpy as np

from . import _detlogp, _dtensor
from ._buffers import grad_array, int64_targets, is_tensor, kernel_threads, raw_view, torch_module
from ._call import join_without_tokens, run_exclusive
from ._checks import check_bool, check_int, check_optional_int
from ._comm import communicator_for, exclusive, peers_fail_on_error
from ._contract import LogprobContract, MaskSpec, ShardingSpec, _softcap, _temperature
from ._detlogp import LogprobContractError
from ._group import resolve_group
from ._kept import (empty_kept_full, kept_argument, outside_neg_inf, selection_argument, token_kept,
                    token_selection)
from ._names import lent, named
from ._storage import check_stamp, stamp

__all__ = ["fused_linear_logprobs", "linear_logits", "fused_kernel_names"]


def fused_kernel_names():
    """The dense kernels of this build and CPU: "scalar-reference", "highway:<TARGET>" ..."""
    return list(_detlogp.fused_kernel_names())


def _view(x, name):
    """(address, dtype, rows, cols, row_stride) of a 2-D CPU tensor or NumPy array, no copy."""
    if is_tensor(x) and x.device.type != "cpu":
        raise LogprobContractError(
            f"{name} must be a CPU tensor (the fused lm_head runs on the CPU); got {x.device}")
    return raw_view(x, name, shape="")


def linear_logits(hidden, weight, *, threads=0, kernel=""):
    """The canonical fp32 logits ``hidden @ weight.T`` (docs/numerics.md, "Fused lm_head"): the
    reference the fused op is bitwise equal to, for debugging. A new fp32 tensor (torch input)
    or array (NumPy input) of shape [tokens, weight rows]."""
    hv = _view(hidden, "hidden")
    wv = _view(weight, "weight")
    if is_tensor(hidden):
        out = torch_module().empty((hv[2], wv[2]), dtype=torch_module().float32)
    else:
        out = np.empty((hv[2], wv[2]), dtype=np.float32)
    _detlogp.linear_logits(hidden=hv, weight=wv, out=_view(out, "out"), threads=threads,
                           kernel=kernel)
    return out


def _check_mixed_grad(hidden, weight):
    """A NumPy array next to a torch tensor that requires grad: autograd could not reach the
    tensor through the NumPy side, and its gradient would silently never be set."""
    torch = torch_module()
    if torch is None or not torch.is_grad_enabled():
        return
    for name, x, other_name, other in (("weight", weight, "hidden", hidden),
                                       ("hidden", hidden, "weight", weight)):
        if is_tensor(x) and x.requires_grad and not is_tensor(other):
            raise LogprobContractError(
                f"{name} is a torch tensor that requires grad but {other_name} is a NumPy "
                f"array: its gradient would never be set. Pass {other_name} as a torch tensor "
                f"(torch.from_numpy({other_name}), no copy), or {name}.detach() if no gradient "
                "is wanted")


def _default_contract(hidden_view, weight_view, targets, comm, real_vocab, tile_width,
                      temperature, ignore_index, bounds=None, softcap=None, active=None):
    """A train contract for even shards of weight rows (padded vocab = local rows x TP) unless
    ``bounds`` gives every rank's rows (a DTensor weight's split), active tokens those whose
    target is not ``ignore_index`` unless ``active`` (one bool per row) says which."""
    tp = 1 if comm is None else comm.size
    rank = 0 if comm is None else comm.rank
    local = weight_view[2]
    if bounds is None:
        bounds = [(r * local, (r + 1) * local) for r in range(tp)]
    bounds = [tuple(b) for b in bounds]
    padded = bounds[-1][1]
    real = padded if real_vocab is None else check_int(real_vocab, "real_vocab", "positive")
    if active is None:
        active = targets != ignore_index
    active = np.asarray(active, dtype=bool).tolist()
    kwargs = {} if tile_width is None else {"tile_width": tile_width}
    return LogprobContract(
        role="train", dtype=hidden_view[1],
        mask=MaskSpec(num_tokens=len(active), active_mask=active, ignore_index=ignore_index),
        sharding=ShardingSpec(tp_rank=rank, tp_world_size=tp, vocab_shard_bounds=bounds,
                              real_vocab_size=real, padded_vocab_size=padded),
        temperature=temperature, softcap=softcap, **kwargs)


def _token_temperature(temperature, tokens):
    """Per-token temperatures (a tensor or array of [tokens] floats) as a float32 NumPy array;
    its values are checked by the operator on every rank."""
    t = temperature.detach().cpu().numpy() if is_tensor(temperature) else temperature
    if t.dtype.kind != "f":
        raise LogprobContractError(
            f"temperature must be a number or floating-point values; got dtype {t.dtype}")
    if t.shape != (tokens,):
        raise LogprobContractError(
            f"a per-token temperature must have the targets' shape ({tokens},); got {t.shape}")
    return np.ascontiguousarray(t, dtype=np.float32)


def _outputs(handle, convert):
    outs = [convert(handle.logp), convert(handle.lse)]
    if handle.entropy is not None:
        outs.append(convert(handle.entropy))
    return tuple(outs)


class _FusedCall:
    """One call of the fused op, prepared once: the op the registry handed out for the contract,
    the views and the options. ``run`` is its forward; as the call of the custom op
    ``detlogp::fused_linear_logprobs`` (_ops.py) it maps (hidden, weight) -> (logp, lse[,
    entropy]) and backward runs the C++ fused backward."""

    constant_outputs = ()

    def __init__(self, op, hv, wv, targets, contract, comm, entropy, validate, threads,
                 row_temperature=None, kept_ids=None, outside_neg_inf=False, top_k=None,
                 top_p=None, empty_kept_full=False):
        self.op, self.hv, self.wv, self.targets = op, hv, wv, targets
        self.empty_kept_full = empty_kept_full  # kept ids all -1: the full vocabulary
        self.top_k, self.top_p = top_k, top_p  # int32 / float32 NumPy [tokens] or None
        self.kept_ids = kept_ids  # int64 [tokens, K] (-1 padded) or None: the full vocabulary
        self.outside_neg_inf = outside_neg_inf
        self.row_temperature = row_temperature  # float32 [tokens] or None: the contract's
        self.contract, self.comm = contract, comm
        self.entropy, self.validate, self.threads = entropy, validate, threads
        self.handle = self.stamps = None

    def run(self, hidden, weight):
        """The forward's FusedHandle; ``hidden`` and ``weight`` own the views."""
        return run_exclusive(self.comm, lambda: _detlogp.fused_forward(
            op=self.op, hidden=self.hv, weight=self.wv, owners=(hidden, weight),
            targets=self.targets, contract=self.contract._cpp, comm=self.comm,
            entropy=self.entropy, validate=self.validate, threads=self.threads,
            row_temperature=self.row_temperature, kept_ids=self.kept_ids,
            outside_neg_inf=self.outside_neg_inf, top_k=self.top_k, top_p=self.top_p,
            empty_kept_full=self.empty_kept_full))

    def forward(self, inputs):
        hidden, weight = inputs
        self.handle = self.run(hidden, weight)
        self.stamps = stamp(hidden), stamp(weight)  # detects freed storage (_storage.py)
        return _outputs(self.handle, torch_module().from_numpy)

    def backward(self, inputs, grads, needs):
        torch = torch_module()
        hidden, weight = inputs
        check_stamp(hidden, self.stamps[0], "hidden")
        check_stamp(weight, self.stamps[1], "weight")
        gh = torch.empty_like(hidden, memory_format=torch.contiguous_format) if needs[0] else None
        gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if needs[1] else None
        grad_logp, grad_lse, grad_entropy = (tuple(grads) + (None,))[:3]
        with exclusive(self.comm):  # backward exchanges grad_hidden partials
            self.handle.backward(
                grad_logp=grad_array(grad_logp), grad_lse=grad_array(grad_lse),
                grad_entropy=grad_array(grad_entropy),
                grad_hidden=None if gh is None else _view(gh, "grad_hidden"),
                grad_weight=None if gw is None else _view(gw, "grad_weight"))
        return gh, gw


class _NoTokensCall:
    """(hidden [0, H], weight) -> empty outputs; backward: zero gradients."""

    constant_outputs = ()

    def __init__(self, hidden, weight, n):
        self.specs = [(t.shape, t.dtype) if is_tensor(t) else None for t in (hidden, weight)]
        self.n = n

    def forward(self, inputs):
        torch = torch_module()
        return tuple(torch.zeros(0, dtype=torch.float32) for _ in range(self.n))

    def backward(self, inputs, grads, needs):
        torch = torch_module()
        return tuple(None if s is None else torch.zeros(s[0], dtype=s[1]) for s in self.specs)


def fused_linear_logprobs(hidden, weight, targets, *, group=None, real_vocab=None, contract=None,
                          entropy=False, temperature=1.0, tile_width=None, ignore_index=-100,
                          validate=True, threads=0, kernel="", softcap=None, kept_ids=None,
                          outside_kept="error", top_k=None, top_p=None, return_kept=False,
                          empty_kept="error", vocab_start=None):
    """``(logp, lse)`` or ``(logp, lse, entropy)`` (fp32 [tokens], replicated on every TP rank)
    of ``softmax(hidden @ weight.T / temperature)`` over the real vocabulary.

    ``hidden`` [tokens, H] and ``weight`` [local_vocab, H]: this rank's rows of the lm_head, in
    bf16, fp16 or fp32 (the same dtype; CPU tensors or NumPy arrays). ``group``: the TP process
    group (torch.distributed) or a detlogp Communicator; None: inferred as in
    ``detlogp.torch`` (one rank, Megatron's TP group, or an error under torch.distributed with
    more than one rank: docs/python.md, "Which group a call runs over"). Without
    ``contract``, the shards are taken as even (padded vocab = local_vocab x TP, rank r owning
    rows [r * local_vocab, (r + 1) * local_vocab)), ``real_vocab`` (default: the padded size)
    marks the padding rows, and tokens whose target is ``ignore_index`` are inactive.
    ``vocab_start`` (only without ``contract``): every rank's weight rows as a table
    ``[(start, end), ...]`` instead of even shards: any contiguous partition of the padded
    vocabulary (vLLM's even split of a 64-padded vocabulary too; bounds off the tiles give the
    bits of aligned ones). With ``contract``, its sharding, mask, temperature, softcap and tile
    width are used as given.
    ``softcap`` (None: no cap; only without ``contract``): scores use
    ``softcap * tanh(logits / softcap) / temperature``. ``temperature``: a number, or a tensor or
    array of one float per token (finite, > 0; the contract's temperature must then be 1): a
    token gets the bits of a call whose temperature is its own. ``kept_ids`` (None: the full
    vocabulary): sampling-replay kept sets, int32/int64 [tokens, K] (each token's kept ids, any
    order, -1 padded, K <= 1024): logp, LSE and entropy are over each token's kept set
    (docs/numerics.md "Kept sets"), ``weight.grad`` is nonzero only on kept rows.
    ``outside_kept``: "error" (a target outside its set raises) or "neg_inf" (logp -inf, no
    logp gradient). ``empty_kept``: "error" (an active token whose ids are all -1 raises) or
    "full" (it is scored over the full vocabulary, the bits of the call without kept sets).
    ``top_k`` / ``top_p`` (None: off; a number or one per token): recomputed
    kept sets, as in ``detlogp.torch.vocab_parallel_logprobs`` (docs/python.md);
    ``return_kept=True`` appends the kept sets, int64 [tokens, width] (-1 padded; eager only).

    Torch tensors that require grad get autograd: ``hidden.grad`` (the full gradient, already
    summed over the TP group) and ``weight.grad`` (this shard's), in their own dtypes.
    Without tokens (``hidden`` [0, H]) the outputs are empty and ``weight.grad`` is zero; at
    TP > 1 every rank must then have none (checked by the preflight).

    A DTensor ``weight`` (vocab rows ``Shard(0)`` on a DeviceMesh dim, even or not) gives the
    group and every rank's rows (``_dtensor.py``); a DTensor ``hidden`` gives DTensor outputs.
    """
    if _dtensor.any_dtensor(hidden, weight, targets):
        if vocab_start is not None:
            raise LogprobContractError(
                "vocab_start= was given with DTensor inputs, whose mesh already says the vocab "
                "bounds; drop vocab_start= (or pass the local tensors and the group)")
        if top_k is not None or top_p is not None or return_kept or empty_kept != "error":
            raise LogprobContractError(
                "top_k, top_p, empty_kept and return_kept are not available with DTensor "
                "inputs; pass the local tensors and the group")
        return _dtensor.fused_linear_logprobs(
            _fused_call, hidden, weight, targets, group=group, contract=contract,
            real_vocab=real_vocab, entropy=entropy, temperature=temperature,
            tile_width=tile_width, ignore_index=ignore_index, validate=validate,
            threads=threads, kernel=kernel, softcap=softcap, kept_ids=kept_ids,
            outside_kept=outside_kept)
    return _fused_call(hidden, weight, targets, group=group, real_vocab=real_vocab,
                       contract=contract, entropy=entropy, temperature=temperature,
                       tile_width=tile_width, ignore_index=ignore_index, validate=validate,
                       threads=threads, kernel=kernel, softcap=softcap, kept_ids=kept_ids,
                       outside_kept=outside_kept, top_k=top_k, top_p=top_p,
                       return_kept=return_kept, empty_kept=empty_kept,
                       bounds=_bounds_table(vocab_start, contract))


def _bounds_table(vocab_start, contract):
    """``vocab_start`` of ``fused_linear_logprobs``: None, or every rank's (start, end) weight
    rows (checked as a partition by the contract)."""
    if vocab_start is None:
        return None
    if contract is not None:
        raise LogprobContractError(
            "vocab_start= with a contract: the contract's sharding already says every rank's "
            "rows; pass one of them")
    if not isinstance(vocab_start, (list, tuple)) or not all(
            isinstance(b, (list, tuple)) and len(b) == 2 for b in vocab_start):
        raise LogprobContractError(
            "vocab_start must be every rank's weight rows as a table [(start, end), ...]; got "
            f"{vocab_start!r}")
    return [tuple(check_int(v, "vocab_start bound") for v in b) for b in vocab_start]


def _fused_call(hidden, weight, targets, *, group, real_vocab, entropy, temperature,
                tile_width, ignore_index, validate, threads, kernel, contract=None, bounds=None,
                softcap=None, kept_ids=None, outside_kept="error", top_k=None, top_p=None,
                return_kept=False, empty_kept="error"):
    """``fused_linear_logprobs`` on plain tensors; ``bounds``: every rank's weight rows
    (default: even shards)."""
    group = resolve_group(group, "fused_linear_logprobs", infer=contract is None)
    torch = torch_module()
    if is_tensor(hidden) and is_tensor(weight):  # the op (detlogp/_ops.py): compilable
        from . import _ops  # imports torch: here, torch is there

        with peers_fail_on_error(group):
            check_bool(entropy, "entropy")
            check_bool(validate, "validate")
            check_bool(return_kept, "return_kept")
            if return_kept and torch.compiler.is_compiling():
                raise LogprobContractError(
                    "return_kept=True is not available under torch.compile: call "
                    "fused_linear_logprobs outside the compiled region for the kept sets")
            if contract is not None and not isinstance(contract, LogprobContract):
                raise LogprobContractError("contract must be a LogprobContract")
            if contract is not None and torch.compiler.is_compiling():
                raise LogprobContractError(
                    "contract= is not available under torch.compile: pass group=, "
                    "real_vocab=, tile_width=, temperature=, softcap= and ignore_index= instead")
            for x, name in ((hidden, "hidden"), (weight, "weight")):
                if not _ops.is_plain(x):
                    _view(x, name)  # raises, saying why
            if not is_tensor(targets) or not _ops.is_plain(targets):
                targets = torch.from_numpy(int64_targets(targets))
            row_temperature = None  # one per token: an op input (the scalar is then 1)
            if is_tensor(temperature) or isinstance(temperature, np.ndarray):
                row_temperature = torch.as_tensor(temperature)
            group_name = _ops.group_name(group)
            rest = (entropy, 1.0 if row_temperature is not None else _temperature(temperature),
                    check_optional_int(tile_width, "tile_width"),
                    check_int(ignore_index, "ignore_index"), validate,
                    check_optional_int(threads, "threads", "non-negative"), _kernel(kernel))
            real_vocab = check_optional_int(real_vocab, "real_vocab")
            rest += (None if bounds is None else
                     [check_int(v, "bounds") for b in bounds for v in b], _softcap(softcap),
                     row_temperature, None, None, False,  # loss_mask, vocab_start, leading_dims
                     _kept_tensor(kept_ids, hidden), outside_neg_inf(outside_kept),
                     *selection_argument(top_k, top_p, tuple(hidden.shape[:1])),
                     empty_kept_full(empty_kept))
        if contract is None:
            logp, lse, ent, saved = _ops.fused_linear_logprobs(hidden, weight, targets,
                                                               group_name, real_vocab, "", *rest)
        else:
            with lent(contract, "contract") as name:
                logp, lse, ent, saved = _ops.fused_linear_logprobs(hidden, weight, targets,
                                                                   group_name, real_vocab, name,
                                                                   *rest)
        outputs = (logp, lse, ent) if entropy else (logp, lse)
        if return_kept:
            outputs += (_kept_output(_ops.call_of(saved), hidden.shape[0], torch.from_numpy),)
        return outputs
    call = _prepare(hidden, weight, targets, group, real_vocab=real_vocab, contract=contract,
                    entropy=entropy, temperature=temperature, tile_width=tile_width,
                    ignore_index=ignore_index, validate=validate, threads=threads,
                    kernel=kernel, bounds=bounds, softcap=softcap, kept_ids=kept_ids,
                    outside_neg_inf=outside_neg_inf(outside_kept), top_k=top_k, top_p=top_p,
                    empty_kept_full=empty_kept_full(empty_kept))
    check_bool(return_kept, "return_kept")
    convert = torch.from_numpy if is_tensor(hidden) else (lambda a: a)
    if isinstance(call, _NoTokensCall):
        if not is_tensor(hidden):
            outputs = tuple(np.zeros(0, dtype=np.float32) for _ in range(call.n))
        else:
            outputs = call.forward(())
        if return_kept:
            outputs = tuple(outputs) + (convert(np.full((0, 0), -1, dtype=np.int64)),)
        return outputs
    if is_tensor(hidden):
        hidden = hidden.detach()
    if is_tensor(weight):
        weight = weight.detach()
    call.handle = call.run(hidden, weight)
    outputs = _outputs(call.handle, convert)
    if return_kept:
        outputs = tuple(outputs) + (_kept_output(call, len(call.targets), convert),)
    return outputs


def _kept_output(call, tokens, convert):
    """The kept sets of an eager call (return_kept=True): int64 [tokens, width], -1 padded
    (width 0 without kept sets)."""
    handle = getattr(call, "handle", None)
    ids = None if handle is None else handle.kept_ids
    return convert(np.full((tokens, 0), -1, dtype=np.int64) if ids is None else ids)


def _kept_tensor(kept_ids, hidden):
    """The op's kept_ids: None, or the checked ids as a torch tensor."""
    kept_argument(kept_ids, tuple(hidden.shape[:1]))
    if kept_ids is None or is_tensor(kept_ids):
        return kept_ids
    return torch_module().from_numpy(token_kept(kept_ids))


def _kernel(kernel):
    if not isinstance(kernel, str):
        raise LogprobContractError(f"kernel must be a string; got {type(kernel).__name__}")
    return kernel


def _prepare(hidden, weight, targets, group, *, real_vocab, contract, entropy, temperature,
             tile_width, ignore_index, validate, threads, kernel, bounds=None, softcap=None,
             active=None, kept_ids=None, outside_neg_inf=False, top_k=None, top_p=None,
             empty_kept_full=False):
    """The call of ``fused_linear_logprobs`` over a resolved ``group``: a ``_FusedCall``, or a
    ``_NoTokensCall`` once every rank agreed that none has tokens. ``bounds``: every rank's
    weight rows (None: even shards); ``active``: which rows are scored (None: those whose
    target is not ``ignore_index``)."""
    with peers_fail_on_error(group):
        check_bool(entropy, "entropy")
        check_bool(validate, "validate")
        threads = kernel_threads(threads, hidden)
        _kernel(kernel)
        hv = _view(hidden, "hidden")
        wv = _view(weight, "weight")
        _check_mixed_grad(hidden, weight)
        tg = int64_targets(targets)
        row_temperature = None
        if is_tensor(temperature) or isinstance(temperature, np.ndarray):
            row_temperature, temperature = _token_temperature(temperature, len(tg)), 1.0
        kept_argument(kept_ids, (hv[2],))
        kept = None if kept_ids is None else token_kept(kept_ids)
        top_k, top_p = token_selection(*selection_argument(top_k, top_p, (hv[2],)), hv[2])
        top_k = None if top_k is None else np.ascontiguousarray(top_k.numpy())
        top_p = None if top_p is None else np.ascontiguousarray(top_p.numpy())
        no_tokens = hv[2] == 0 and len(tg) == 0 and contract is None
        if contract is None:
            comm = None if group is None else communicator_for(group, 2)
            if not no_tokens:
                contract = _default_contract(hv, wv, tg, comm, real_vocab, tile_width,
                                             temperature, ignore_index, bounds, softcap,
                                             active)
        elif not isinstance(contract, LogprobContract):
            raise LogprobContractError("contract must be a LogprobContract")
        elif softcap is not None:
            raise LogprobContractError(
                f"softcap={softcap!r} with a contract: the contract's softcap "
                f"({contract.softcap!r}) is used; pass the cap in the contract, not both")
        if not no_tokens:
            comm = communicator_for(group, contract.sharding.tp_world_size)
            # The registry's fused op kind: the capability is checked, the provenance kept.
            op = _detlogp.get_fused_linear_logprob_op(contract._cpp, kernel)
    if no_tokens:
        join_without_tokens(comm)
        return _NoTokensCall(hidden, weight, 3 if entropy else 2)
    return _FusedCall(op, hv, wv, tg, contract, comm, entropy, validate, threads,
                      row_temperature, kept, outside_neg_inf, top_k, top_p, empty_kept_full)


def _op_call(hidden, weight, targets, group, real_vocab, contract, entropy, temperature,
             tile_width, ignore_index, validate, threads, kernel, vocab_bounds, softcap,
             row_temperature, loss_mask=None, vocab_start=None, leading_dims=False,
             kept_ids=None, outside_neg_inf=False, top_k=None, top_p=None,
             empty_kept_full=False):
    """The implementation of the op ``detlogp::fused_linear_logprobs`` up to its forward.
    ``leading_dims``: the call of ``fused_vocab_parallel_logprobs`` (hidden [..., H], targets,
    ``loss_mask`` and ``vocab_start`` as ``detlogp.torch`` reads them: _fused_tokens.py)."""
    from . import _ops

    bounds = None if vocab_bounds is None else list(zip(vocab_bounds[::2], vocab_bounds[1::2]))
    if row_temperature is not None:  # one per token (the op's scalar is then 1)
        temperature = row_temperature
    if leading_dims:
        if kept_ids is not None or top_k is not None or top_p is not None:
            raise LogprobContractError(
                "kept_ids: fused_vocab_parallel_logprobs takes no kept sets; call "
                "fused_linear_logprobs (hidden [tokens, H]) or vocab_parallel_logprobs")
        from . import _fused_tokens

        return _fused_tokens.prepare(
            hidden, weight, targets, loss_mask, _ops.group_of(group), real_vocab=real_vocab,
            ignore_index=ignore_index, temperature=temperature, entropy=entropy,
            vocab_start=bounds if bounds is not None else vocab_start, threads=threads,
            tile_width=tile_width, softcap=softcap, validate=validate, kernel=kernel)
    return _prepare(hidden, weight, targets, _ops.group_of(group), real_vocab=real_vocab,
                    contract=named(contract) if contract else None, entropy=entropy,
                    temperature=temperature, tile_width=tile_width, ignore_index=ignore_index,
                    validate=validate, threads=threads, kernel=kernel, bounds=bounds,
                    softcap=softcap, kept_ids=kept_ids, outside_neg_inf=outside_neg_inf,
                    top_k=top_k, top_p=top_p, empty_kept_full=empty_kept_full)
