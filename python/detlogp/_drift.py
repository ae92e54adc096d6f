"""``detlogp.drift()``: train/rollout logprob drift from tensors, for a trainer's every step.

The statistics are the C++ library's (include/detlogp/drift.hpp), the very ones
``detlogp drift`` prints for files, so the two never disagree. Over the active tokens,
d = candidate - reference (in double, from fp32 values):

- ``count``, ``max_abs``, ``mean_abs``, ``p95_abs``, ``p99_abs`` (linear-interpolated quantiles)
- ``max_rel`` = max |d| / max(|reference|, 1e-12) (a zero reference stays finite)
- ``worst``: the first token with the largest |d| (index, candidate, reference, abs_diff)
- ``approx_kl0`` = mean(exp(d) - 1 - d), ``clipfrac0`` = fraction of exp(d) outside [0.8, 1.2]
- ``non_finite``/``first_non_finite``: active tokens with a NaN or infinite value
- ``thresholds`` of the dtype, ``failures`` (why it fails) and ``passed``.

    stats = detlogp.drift(train_logp, rollout_logp, mask=response_mask, dtype="bf16")
    log({"max_abs_dlogp": stats["max_abs"], "approx_kl0": stats["approx_kl0"]})
"""

import numpy as np

from . import _detlogp
from ._detlogp import LogprobContractError
from ._dtypes import name_of_torch_dtype
from ._enums import DType, coerce_enum
from ._mask import active_from_mask

__all__ = ["drift", "drift_thresholds"]


def _is_tensor(x):
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, torch.Tensor)


def _values(x, name):
    """A 1-D fp32 NumPy copy of per-token logprobs (tensor on any device, array or list)."""
    if _is_tensor(x):
        import torch

        if x.dtype.is_complex or not (x.dtype.is_floating_point or x.dtype == torch.int64):
            raise LogprobContractError(f"{name} must hold floating-point logprobs; got {x.dtype}")
        x = x.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise LogprobContractError(f"{name} must hold floating-point logprobs; got dtype {a.dtype}")
    if a.ndim != 1:
        raise LogprobContractError(f"{name} must be 1-D [tokens]; got shape {a.shape}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _mask(m, tokens):
    if m is None:
        return None
    active = active_from_mask(m, (tokens,), "mask", f"one entry per token, shape ({tokens},)")
    return (active if isinstance(active, np.ndarray) else active.numpy()).view(np.uint8)


def _dtype_name(dtype):
    if _is_tensor_dtype(dtype):
        name = name_of_torch_dtype(dtype)
        if name is None:
            raise LogprobContractError(f"dtype must be bf16, fp16 or fp32; got {dtype}")
        return name
    return coerce_enum(DType, dtype, "dtype").value


def _is_tensor_dtype(dtype):
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(dtype, torch.dtype)


def drift(candidate_logp, reference_logp, mask=None, dtype="bf16"):
    """Drift statistics of ``candidate_logp`` against ``reference_logp`` (1-D, one value per
    token; torch tensors on any device, NumPy arrays or lists), over the tokens where ``mask``
    is nonzero (None: every token; bool, int or float, like ``detlogp.torch``'s ``loss_mask``:
    verl's float ``response_mask`` as is). ``dtype`` ("bf16", "fp16", "fp32", a DType or a
    torch dtype: the dtype of the logits behind the candidate) picks the tolerances of the
    verdict. Returns a dict (see the module docstring); never raises because of drift, only for
    bad input."""
    cand = _values(candidate_logp, "candidate_logp")
    ref = _values(reference_logp, "reference_logp")
    if ref.shape != cand.shape:
        raise LogprobContractError(
            f"reference_logp has shape {ref.shape}; expected {cand.shape} (the shape of "
            "candidate_logp)")
    return _detlogp.drift(candidate=cand, reference=ref, mask=_mask(mask, cand.shape[0]),
                          dtype=_dtype_name(dtype))


def drift_thresholds(dtype="bf16"):
    """The verdict's tolerances for ``dtype``: max_abs, approx_kl0, clipfrac0 and the clip
    interval."""
    return _detlogp.drift_thresholds(_dtype_name(dtype))
