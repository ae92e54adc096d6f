"""The TP group of a functional-API call: the one rule every entry point that takes ``group=``
applies (``detlogp.torch``'s functions, ``fused_linear_logprobs``; docs/python.md, "Which group
a call runs over").

- ``group`` given: a torch.distributed ProcessGroup or a detlogp ``Communicator`` (e.g.
  ``detlogp.SelfComm()``: one rank holding the whole vocabulary); anything else raises.
- ``group=None``: Megatron's tensor-model-parallel group when ``megatron.core``'s parallel
  state is loaded and initialized. Otherwise, when torch.distributed is initialized
  with more than one rank, the call raises: the logits may be this rank's vocab shard, and
  taking them for the whole vocabulary would give a wrong logp without any error. Otherwise
  (no torch.distributed, or a world of one) the call runs on one rank.

The rule runs no collective, so a rank that raises here leaves its peers waiting in the
preflight of their own call (when they passed a group); they raise when their collective
timeout expires, saying that a rank did not arrive.
"""

import sys

from ._comm import Communicator
from ._detlogp import LogprobContractError


def megatron_tp_group():
    """Megatron's tensor-parallel group when megatron.core's parallel state is loaded and
    initialized (a trainer that initialized it has imported it; nothing is imported here)."""
    parallel_state = sys.modules.get("megatron.core.parallel_state")
    if parallel_state is None:
        return None
    try:
        if parallel_state.model_parallel_is_initialized():
            return parallel_state.get_tensor_model_parallel_group()
    except Exception:  # noqa: BLE001 - an uninitialized Megatron: no group to default to
        return None
    return None


def _dist():
    """torch.distributed when it is already imported (never imports torch)."""
    return sys.modules.get("torch.distributed")


def _initialized_world_size():
    dist = _dist()
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size()


def _is_process_group(group):
    dist = _dist()
    pg = getattr(dist, "ProcessGroup", None) if dist is not None else None
    return pg is not None and isinstance(group, pg)


def resolve_group(group, entry, infer=True):
    """The TP group of a call to ``entry`` (the function's name, for messages): a ProcessGroup,
    a Communicator, or None for one rank. Raises LogprobContractError as described above.
    ``infer=False``: the call says its TP size itself (an explicit contract), so None stays
    None (the contract's checks then ask for a group where it needs one)."""
    if group is None and not infer:
        return None
    if group is None:
        group = megatron_tp_group()
        if group is not None:
            return group
        world = _initialized_world_size()
        if world > 1:
            raise LogprobContractError(
                f"{entry}: group= is missing: torch.distributed is initialized with {world} "
                "ranks and no Megatron tensor-parallel group is initialized, so detlogp cannot "
                "tell whether these logits are this rank's vocab shard or the whole "
                "vocabulary (taking a shard for the whole vocabulary gives a wrong logp). Pass "
                "group=<the TP process group> (e.g. torch.distributed.new_group(tp_ranks)) "
                "when the vocabulary is sharded, or group=detlogp.SelfComm() when every rank "
                "holds the whole vocabulary")
        return None
    if isinstance(group, Communicator) or _is_process_group(group):
        return group
    raise LogprobContractError(
        f"{entry}: group must be a torch.distributed ProcessGroup (the TP group), a "
        f"detlogp.Communicator (detlogp.SelfComm() for one rank) or None; got "
        f"{type(group).__name__} {group!r}")
