"""Sampling-replay kept sets as the entry points take them (``kept_ids=``, ``outside_kept=``),
read one way by ``detlogp.torch.vocab_parallel_logprobs`` and ``fused_linear_logprobs``: per
token the vocabulary ids the rollout engine kept, int32 or int64 values of the targets' shape
plus one last dimension K >= 1, padded with -1, in any order (docs/numerics.md, "Kept sets").
The operator checks the ids themselves on every rank (field "kept_ids")."""

import numpy as np

from ._buffers import is_tensor
from ._detlogp import LogprobContractError

__all__ = ["kept_argument", "outside_neg_inf", "token_kept"]

_OUTSIDE = {"error": False, "neg_inf": True}


def kept_argument(kept_ids, lead_shape):
    """``kept_ids`` checked against the targets' shape ``lead_shape``: None, or an int32 /
    int64 torch tensor (or NumPy array) of shape ``lead_shape + (K,)``, K >= 1; returned as
    given."""
    if kept_ids is None:
        return None
    if not (is_tensor(kept_ids) or isinstance(kept_ids, np.ndarray)):
        raise LogprobContractError(
            f"kept_ids must be a tensor of int32 or int64 ids (-1 padded); got "
            f"{type(kept_ids).__name__}")
    dtype = str(kept_ids.dtype).replace("torch.", "")
    if dtype not in ("int32", "int64"):
        raise LogprobContractError(
            f"kept_ids must hold int32 or int64 ids (-1 padded); got dtype {dtype}")
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
    """Checked ``kept_ids`` as a contiguous int64 NumPy array [tokens, K], in token order."""
    a = kept_ids.detach().cpu().numpy() if is_tensor(kept_ids) else kept_ids
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]), dtype=np.int64)
