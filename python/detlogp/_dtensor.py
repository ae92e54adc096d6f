"""DTensor inputs: a vocab-sharded ``torch.distributed.tensor.DTensor`` in, DTensors out.

    logits = DTensor [..., vocab], Shard(-1) on the TP dim of its DeviceMesh (1-D, or 2-D DP x TP)
    logp = vocab_parallel_logprobs(logits, targets)      # a DTensor, Replicate on the TP dim

What a DTensor says replaces three arguments of a plain call (docs/python.md, "DTensor
inputs"): the TP group is the mesh's group on the mesh dim that shards the vocabulary, this
rank's shard is ``to_local()``, and the table of every rank's vocab bounds is DTensor's own
split of the global vocabulary (``torch.chunk``'s rule: ``ceil(V / tp)`` columns per rank, the
last ranks fewer: ``Shard.local_shard_size_and_offset``). The call then runs on the local
tensors exactly as a plain call with ``group=`` and ``vocab_start=`` that table, so the bits are
the plain call's. Outputs are DTensors on the same mesh: Replicate on the TP dim (every TP rank
holds the same bits), the logits' own placement of the token dims on every other mesh dim.
``to_local()`` and ``DTensor.from_local`` are differentiable, so the gradient reaches the
DTensor input as a DTensor with its placements.

This module imports nothing of torch.distributed: a DTensor exists only once its module is
imported, so ``is_dtensor`` looks the module up in ``sys.modules``.
"""

import contextlib
import sys

from ._comm import SelfComm, peers_fail_on_error
from ._detlogp import LogprobContractError

_ONE_RANK = SelfComm()  # the group of a DTensor whose vocabulary no mesh dim shards


def _tensor_module():
    return sys.modules.get("torch.distributed.tensor")


def is_dtensor(x):
    """``x`` is a DTensor (False without importing anything when no DTensor can exist)."""
    mod = _tensor_module()
    cls = getattr(mod, "DTensor", None) if mod is not None else None
    return cls is not None and isinstance(x, cls)


def any_dtensor(*xs):
    return any(is_dtensor(x) for x in xs)


def _placements_text(placements):
    return "(" + ", ".join(repr(p) for p in placements) + ")"


class _Sharded:
    """A DTensor whose dim ``vocab_dim`` is the vocabulary: its local tensor, its mesh, the mesh
    dim that shards the vocabulary (None: every rank holds all of it), that dim's process group
    (``comm``), this rank's index on it, the bounds table and the placements of the outputs.
    Its placement checks depend on the DTensor's metadata only, the same on every rank."""

    def __init__(self, dt, vocab_dim, token_dims, name):
        mod = _tensor_module()
        shard, replicate = mod.Shard, mod.Replicate
        self.mesh, self.placements = dt.device_mesh, tuple(dt.placements)
        vocab_dim %= dt.dim()
        self.tp_dim = None
        for i, p in enumerate(self.placements):
            if type(p) is replicate or (type(p) is shard and p.dim % dt.dim() in token_dims):
                continue
            if type(p) is shard and p.dim % dt.dim() == vocab_dim and self.tp_dim is None:
                self.tp_dim = i
                continue
            raise LogprobContractError(
                f"{name}: a DTensor with placements {_placements_text(self.placements)} on a "
                f"mesh of shape {tuple(self.mesh.shape)}: placement {p!r} on mesh dim {i} is not "
                f"supported. detlogp takes the vocabulary (dim {vocab_dim}) sharded by one mesh "
                "dim, Shard(dim), and every other mesh dim Replicate"
                + (" or Shard of a token dim" if token_dims else "")
                + f"; fix: {name}.redistribute(mesh, placements) to such placements first")
        self.vocab_dim, self.name = vocab_dim, name
        vocab = dt.shape[vocab_dim]
        if self.tp_dim is None:  # the whole vocabulary on every rank
            self.comm, self.tp, self.rank = _ONE_RANK, 1, 0
            self.bounds = ((0, vocab),)
        else:
            self.comm = self.mesh.get_group(self.tp_dim)
            self.tp = self.mesh.size(self.tp_dim)
            self.rank = self.mesh.get_local_rank(self.tp_dim)
            self.bounds = vocab_bounds(vocab, self.tp)
        self.local = dt.to_local()
        self.out_placements = tuple(
            replicate() if i == self.tp_dim else p for i, p in enumerate(self.placements))

    def check_local(self):
        """This rank's shard is the one the bounds table gives it (the only check that
        depends on the rank: run where a failure fails the peers too)."""
        start, end = self.bounds[self.rank]
        width = self.local.shape[self.vocab_dim]
        if width != end - start:
            raise LogprobContractError(
                f"{self.name}: this rank's local shard has {width} vocab columns but DTensor's "
                f"split of {self.bounds[-1][1]} columns over {self.tp} ranks gives TP rank "
                f"{self.rank} the columns [{start}, {end}); pass a DTensor made by "
                "distribute_tensor, or by DTensor.from_local with the global shape")


def vocab_bounds(vocab, tp):
    """Every TP rank's ``(start, end)`` of a DTensor's ``Shard`` of ``vocab`` columns over
    ``tp`` ranks: DTensor's rule, ``torch.chunk``'s (``Shard.local_shard_size_and_offset``):
    ``ceil(vocab / tp)`` columns per rank, the last ones fewer, possibly none."""
    chunk = -(-vocab // tp)
    return tuple((min(vocab, chunk * r), min(vocab, chunk * (r + 1))) for r in range(tp))


def _local_of(x, sharded, name):
    """``x``'s local tensor: a plain tensor as is; a DTensor must be on the mesh of the sharded
    input with the outputs' placements (Replicate on the TP dim, the sharded input's placement
    of the token dims elsewhere), so that its local tensor holds this rank's tokens."""
    if not is_dtensor(x):
        return x
    if x.device_mesh != sharded.mesh or tuple(x.placements) != sharded.out_placements:
        raise LogprobContractError(
            f"{name} is a DTensor with placements {_placements_text(x.placements)} but the "
            f"tokens are laid out as {_placements_text(sharded.out_placements)} on the "
            f"sharded input's mesh (Replicate on the TP dim); pass {name}.redistribute(mesh, "
            f"{_placements_text(sharded.out_placements)}) or this rank's plain tensor")
    return x.to_local()


def _wrap(out, sharded, lead_shape):
    """A local output [tokens...] as a DTensor of the global ``lead_shape``."""
    dtensor = _tensor_module().DTensor
    stride, step = [], 1
    for n in reversed(lead_shape):
        stride.insert(0, step)
        step *= max(n, 1)
    return dtensor.from_local(out, sharded.mesh, sharded.out_placements, run_check=False,
                              shape=tuple(lead_shape), stride=tuple(stride))


@contextlib.contextmanager
def _from_the_mesh(sharded, name):
    """A contract error of the plain call names where its group and bounds came from: the
    caller passed neither, the DTensor did."""
    try:
        yield
    except LogprobContractError as e:
        where = ("one rank (no mesh dim shards the vocabulary)" if sharded.tp_dim is None else
                 f"TP group = mesh dim {sharded.tp_dim} of the mesh {tuple(sharded.mesh.shape)}, "
                 f"vocab bounds = DTensor's split {list(sharded.bounds)}")
        raise LogprobContractError(f"{e} [{name} is a DTensor: {where}]") from e


def _refuse_given(name, sharded_name, **given):
    """``group=`` (and the other arguments a DTensor says itself) next to a DTensor."""
    for which, value in given.items():
        if value is not None:
            raise LogprobContractError(
                f"{name}: {which}= was given with a DTensor {sharded_name}, whose mesh already "
                f"says the TP group and the vocab bounds; drop {which}= (or pass "
                f"{sharded_name}.to_local())")


def vocab_parallel_logprobs(fn, logits, targets, *, group, vocab_start, loss_mask, **kwargs):
    """``fn`` (``detlogp.torch.vocab_parallel_logprobs``) on DTensor logits: the plain call on
    the local tensors, the outputs wrapped (the contract, when asked for, as it is)."""
    if not is_dtensor(logits):
        raise LogprobContractError(
            "targets or loss_mask is a DTensor but logits is not; pass DTensor logits "
            "(vocab Shard(-1)) or plain tensors throughout")
    _refuse_given("vocab_parallel_logprobs", "logits", group=group, vocab_start=vocab_start)
    sharded = _Sharded(logits, -1, range(logits.dim() - 1), "logits")
    with peers_fail_on_error(sharded.comm):
        sharded.check_local()
        targets = _local_of(targets, sharded, "targets")
        loss_mask = _local_of(loss_mask, sharded, "loss_mask")
        if is_dtensor(kwargs.get("temperature")):  # per-token temperatures travel as targets do
            kwargs["temperature"] = _local_of(kwargs["temperature"], sharded, "temperature")
        if is_dtensor(kwargs.get("kept_ids")):  # per-token kept sets too ([..., K])
            kwargs["kept_ids"] = _local_of(kwargs["kept_ids"], sharded, "kept_ids")
    with _from_the_mesh(sharded, "logits"):
        out = fn(sharded.local, targets, group=sharded.comm, vocab_start=list(sharded.bounds),
                 loss_mask=loss_mask, **kwargs)
    lead = tuple(logits.shape[:-1])
    if isinstance(out, tuple):
        return tuple(o if not _is_tensor(o) else _wrap(o, sharded, lead) for o in out)
    return _wrap(out, sharded, lead)


def fused_linear_logprobs(fn, hidden, weight, targets, *, group, contract,
                          name="fused_linear_logprobs", **kwargs):
    """``fn`` (the fused op's call with a bounds table) on a DTensor lm_head weight [vocab, H]
    (Shard(0) on the TP dim, Replicate on any other mesh dim): the group and the bounds from its
    mesh. ``hidden`` [..., H]: a plain tensor (plain outputs) or a DTensor Replicate on the
    weight's mesh (Replicate DTensor outputs of its leading shape). ``name``: the caller
    (``fused_linear_logprobs`` or ``fused_vocab_parallel_logprobs``); a ``loss_mask`` or
    per-token ``temperature`` in ``kwargs`` is read as ``targets`` is."""
    if not is_dtensor(weight):
        raise LogprobContractError(
            f"{name}: hidden or targets is a DTensor but weight is not; pass the lm_head weight "
            "as a DTensor (vocab rows Shard(0) on the TP dim) or plain tensors throughout")
    _refuse_given(name, "weight", group=group, contract=contract)
    sharded = _Sharded(weight, 0, (), "weight")
    with peers_fail_on_error(sharded.comm):
        sharded.check_local()
        # hidden: on the weight's mesh, Replicate everywhere (its tokens are every rank's; on
        # a DP x TP mesh the DTensors of a TP layer live on the TP sub-mesh, mesh["tp"]).
        local_hidden = _local_of(hidden, sharded, "hidden")
        targets = _local_of(targets, sharded, "targets")
        for key in ("loss_mask", "temperature"):  # per-token inputs travel as targets do
            if is_dtensor(kwargs.get(key)):
                kwargs[key] = _local_of(kwargs[key], sharded, key)
    with _from_the_mesh(sharded, "weight"):
        out = fn(local_hidden, sharded.local, targets, group=sharded.comm,
                 bounds=sharded.bounds, **kwargs)
    if not is_dtensor(hidden):
        return out
    lead = tuple(hidden.shape[:-1])
    if not isinstance(out, tuple):
        return _wrap(out, sharded, lead)
    return tuple(o if not _is_tensor(o) else _wrap(o, sharded, lead) for o in out)


def _is_tensor(x):
    import torch

    return isinstance(x, torch.Tensor)
