"""The per-token mask as trainers pass it, read one way by every entry point that takes one
(``detlogp.torch``'s ``loss_mask``, ``detlogp.drift``'s ``mask``).

A mask is a torch tensor (any device), a NumPy array or a nested list of bools, integers or
floating-point numbers (verl's ``response_mask`` is float: prompt 0, response 1); nonzero means
scored. Complex, string and object masks are refused.
"""

import sys

import numpy as np

from ._detlogp import LogprobContractError

__all__ = ["active_from_mask", "mask_array"]


def mask_array(mask, field):
    """A mask that is not a torch tensor as a contiguous NumPy array of bools, integers or
    floats (nonzero = scored); anything else raises, naming ``field``."""
    try:
        a = np.asarray(mask)
    except (TypeError, ValueError):
        raise LogprobContractError(
            f"{field} must be an array of bools, integers or floats (nonzero = scored); got "
            f"{type(mask).__name__}") from None
    if a.dtype.kind not in "biuf":
        raise LogprobContractError(
            f"{field} must hold bools, integers or floats (nonzero = scored); got dtype {a.dtype}")
    return np.ascontiguousarray(a)


def active_from_mask(mask, shape, field, expected):
    """``mask`` (of ``shape``) as a flat, contiguous bool array on the CPU, ``mask != 0``: a
    torch tensor for a torch mask (a trainer's every call: no trip through NumPy), else a NumPy
    array. ``field`` names the argument and ``expected`` says what its shape must be, for the
    errors ("loss_mask must have the targets' shape (2, 8); got (2, 9)")."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(mask, torch.Tensor):
        m = mask.detach()
        if m.dtype.is_complex or m.is_quantized:
            raise LogprobContractError(
                f"{field} must hold bools, integers or floats (nonzero = scored); got {m.dtype}")
        if tuple(m.shape) != tuple(shape):
            raise LogprobContractError(f"{field} must have {expected}; got {tuple(m.shape)}")
        m = m.reshape(-1).cpu()
        return (m if m.dtype == torch.bool else m != 0).contiguous()
    a = mask_array(mask, field)
    if a.shape != tuple(shape):
        raise LogprobContractError(f"{field} must have {expected}; got {a.shape}")
    return np.ascontiguousarray(a.reshape(-1) != 0)
