"""Sampling-replay kept sets as the entry points take them (``kept_ids=``, ``outside_kept=``),
read one way by ``detlogp.torch.vocab_parallel_logprobs`` and ``fused_linear_logprobs``: per
token the vocabulary ids the rollout engine kept, int32 or int64 values of the targets' shape
plus one last dimension K >= 1, padded with -1, in any order (docs/numerics.md, "Kept sets").
The operator checks the ids themselves on every rank (field "kept_ids")."""

import numpy as np

from ._buffers import is_tensor
from ._detlogp import LogprobContractError

__all__ = ["kept_argument", "outside_neg_inf", "empty_kept_full", "token_kept", "selection_argument",
           "row_selection", "token_selection", "kept_output"]

_OUTSIDE = {"error": False, "neg_inf": True}
_EMPTY = {"error": False, "full": True}


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


def empty_kept_full(empty_kept):
    """``empty_kept`` ("error" or "full") as the op's bool: whether a token whose kept ids are
    all -1 is scored over the full vocabulary (an unrestricted row of a rollout batch, as
    ``detlogp.sample``'s ``kept`` has it) instead of raising."""
    if not isinstance(empty_kept, str) or empty_kept not in _EMPTY:
        raise LogprobContractError(f"empty_kept must be 'error' or 'full'; got {empty_kept!r}")
    return _EMPTY[empty_kept]


def token_kept(kept_ids):
    """Checked ``kept_ids`` as a contiguous int64 NumPy array [tokens, K], in token order."""
    a = kept_ids.detach().cpu().numpy() if is_tensor(kept_ids) else kept_ids
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]), dtype=np.int64)


def _per_token(value, name, lead_shape, dtypes, np_dtype, kind):
    """One sampling parameter (``top_k`` or ``top_p``) as a tensor of the targets' shape: a
    number is every token's, a tensor must have that shape and one of ``dtypes``."""
    torch = _torch()
    lead = tuple(lead_shape)
    if is_tensor(value) or isinstance(value, np.ndarray):
        dtype = str(value.dtype).replace("torch.", "")
        if dtype not in dtypes or tuple(value.shape) != lead:
            raise LogprobContractError(
                f"{name} must be {kind} or a tensor of the targets' shape {lead} and dtype "
                f"{' or '.join(dtypes)}; got shape {tuple(value.shape)} dtype {dtype}")
        t = value.detach().cpu() if is_tensor(value) else torch.from_numpy(value)
        return t.to(np_dtype).contiguous()
    ok = isinstance(value, int) if np_dtype is torch.int32 else isinstance(value, (int, float))
    if not ok or isinstance(value, bool):
        raise LogprobContractError(
            f"{name} must be {kind} or a tensor of the targets' shape {lead}; got "
            f"{type(value).__name__}")
    if np_dtype is torch.int32 and not -2**31 <= value < 2**31:
        raise LogprobContractError(f"{name} = {value} is out of range; top_k is 0 (off) or "
                                   "1 to 1024")
    return torch.full(lead, value, dtype=np_dtype)


def _torch():
    import torch

    return torch


def selection_argument(top_k, top_p, lead_shape):
    """``top_k`` / ``top_p`` as the op takes them: None (off), or an int32 / float32 tensor of
    the targets' shape (a number is every token's). The operator checks the values on every
    rank (fields "top_k", "top_p")."""
    torch = _torch()
    k = None if top_k is None else _per_token(
        top_k, "top_k", lead_shape, ("int32", "int64"), torch.int32, "an int")
    p = None if top_p is None else _per_token(
        top_p, "top_p", lead_shape, ("float32", "float64"), torch.float32, "a number")
    return k, p


def row_selection(top_k, top_p, cover, to_rows):
    """Per-token ``top_k`` / ``top_p`` tensors (or None) as the operator's per-row NumPy arrays
    (both given when either is: top_k 0, top_p 1 where off); rows that are no token (holes in
    the cover) get top_k 1 (a restricted row; its outputs are never read)."""
    k, p = token_selection(top_k, top_p, cover.tokens)
    if k is None:
        return None, None
    return (np.ascontiguousarray(to_rows(k, cover, 1).numpy()),
            np.ascontiguousarray(to_rows(p, cover, 1.0).numpy()))


def token_selection(top_k, top_p, tokens):
    """Per-token ``top_k`` / ``top_p`` tensors (or None) as flat int32 / float32 tensors, both
    given when either is (top_k 0, top_p 1 where off); (None, None) when neither is."""
    torch = _torch()
    if top_k is None and top_p is None:
        return None, None
    k = torch.zeros(tokens, dtype=torch.int32) if top_k is None else top_k.reshape(-1)
    p = torch.ones(tokens, dtype=torch.float32) if top_p is None else top_p.reshape(-1)
    return k, p


def kept_output(ids, cover, device):
    """The call's kept sets (int64 NumPy [rows, width] or None) per token: an int64 tensor of
    the targets' shape plus the width (-1 padded; width 0 without kept sets)."""
    torch = _torch()
    lead = tuple(cover.lead_shape)
    if ids is None:
        return torch.full(lead + (0,), -1, dtype=torch.int64, device=device)
    t = torch.from_numpy(ids)
    if not cover.identity:
        t = t[cover.token_rows]
    return t.reshape(lead + (ids.shape[1],)).to(device)
