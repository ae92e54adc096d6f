"""The one table of element types: detlogp's dtype names and the torch and NumPy types they are.

NumPy has no bfloat16 of its own, so bf16 buffers come as torch tensors only. torch is looked up
when a torch type is asked for (the package imports without torch).
"""

import sys

import numpy as np

from ._detlogp import LogprobContractError

# (detlogp name, torch dtype attribute, NumPy dtype or None)
_TABLE = (("bf16", "bfloat16", None),
          ("fp16", "float16", np.float16),
          ("fp32", "float32", np.float32))

_NUMPY_NAMES = {np.dtype(numpy): name for name, _, numpy in _TABLE if numpy is not None}


def _torch_names():
    torch = sys.modules["torch"]  # a torch dtype was given: torch is imported
    return {getattr(torch, attr): name for name, attr, _ in _TABLE}


def torch_dtype(name):
    """The torch dtype of a detlogp dtype name ("bf16" -> torch.bfloat16)."""
    import torch

    return next(getattr(torch, attr) for n, attr, _ in _TABLE if n == name)


def name_of_torch_dtype(dtype):
    """The detlogp name of a torch dtype, or None when detlogp does not support it."""
    return _torch_names().get(dtype)


def name_of_tensor(x, field):
    """The detlogp dtype name of torch tensor ``x``; LogprobContractError naming ``field``
    when detlogp does not support its dtype."""
    name = _torch_names().get(x.dtype)
    if name is None:
        raise LogprobContractError(
            f"{field} dtype {x.dtype} is not supported; expected torch.bfloat16, "
            "torch.float16 or torch.float32")
    return name


def name_of_array(a, field):
    """The detlogp dtype name of NumPy array ``a``; LogprobContractError naming ``field``
    when detlogp does not support its dtype."""
    name = _NUMPY_NAMES.get(a.dtype)
    if name is None:
        raise LogprobContractError(
            f"{field} dtype {a.dtype} is not supported; expected float16 or float32 "
            "(bf16: pass a torch.bfloat16 tensor)")
    return name
