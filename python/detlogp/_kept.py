"""Sampling-replay kept sets as the torch entry points take them (``kept_ids=``,
``outside_kept=``), read one way by ``vocab_parallel_logprobs`` and ``fused_linear_logprobs``:
per token the vocabulary ids the rollout engine kept, an integer tensor of the targets' shape
plus one last dimension K, padded with -1, any order (docs/numerics.md, "Kept sets"). The
operator checks the ids themselves on every rank (field "kept_ids")."""

import torch

from ._detlogp import LogprobContractError

__all__ = ["kept_argument", "outside_neg_inf", "token_kept"]

_OUTSIDE = {"error": False, "neg_inf": True}


def kept_argument(kept_ids, lead_shape):
    """``kept_ids`` checked against the targets' shape ``lead_shape``: None, or an int32 /
    int64 tensor of shape ``lead_shape + (K,)`` with 1 <= K (the op's argument, as given)."""
    if kept_ids is None:
        return None
    if not isinstance(kept_ids, torch.Tensor):
        raise LogprobContractError(
            f"kept_ids must be a torch.Tensor of int32 or int64 ids (-1 padded); got "
            f"{type(kept_ids).__name__}")
    if kept_ids.dtype not in (torch.int32, torch.int64):
        raise LogprobContractError(
            f"kept_ids must hold int32 or int64 ids (-1 padded); got dtype {kept_ids.dtype}")
    lead = tuple(lead_shape)
    shape = tuple(kept_ids.shape)
    if len(shape) != len(lead) + 1 or shape[:-1] != lead or shape[-1] < 1:
        raise LogprobContractError(
            f"kept_ids must have the targets' shape {lead} plus one last dimension K >= 1 (the "
            f"kept ids of each token, -1 padded); got {shape}")
    return kept_ids


def outside_neg_inf(outside_kept):
    """``outside_kept`` ("error" or "neg_inf") as the op's bool: whether a target outside its
    kept set scores -inf instead of raising."""
    if not isinstance(outside_kept, str) or outside_kept not in _OUTSIDE:
        raise LogprobContractError(
            f"outside_kept must be 'error' or 'neg_inf'; got {outside_kept!r}")
    return _OUTSIDE[outside_kept]


def token_kept(kept_ids):
    """The op's ``kept_ids`` tensor as int64 [tokens, K] on the CPU, in token order."""
    return kept_ids.detach().reshape(-1, kept_ids.shape[-1]).to(device="cpu",
                                                                 dtype=torch.int64)
