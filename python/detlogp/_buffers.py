"""The caller's buffers as the C++ library reads them, checked and converted once per call.

A 2-D buffer (the logits; the fused lm_head's hidden states, weight and gradients) crosses as a
raw view ``(address, dtype, rows, cols, row_stride)`` of the caller's memory, never a copy: a
CPU or CUDA torch tensor gives its (device) address, a NumPy array its data pointer. Per-token
vectors cross as small contiguous NumPy arrays (int64 targets, fp32 incoming gradients).

Where a buffer lives picks the registry platform: "cuda" for a CUDA tensor, "cpu" for a CPU
tensor or a NumPy array; any other device raises.
"""

import contextlib
import sys

import numpy as np

from ._checks import check_int
from ._detlogp import LogprobContractError
from ._dtypes import name_of_array, name_of_tensor

PLATFORMS = ("cpu", "cuda")


def torch_module():
    """torch, or None where it is not installed (NumPy input needs no torch)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    return torch


def is_tensor(x):
    """Whether ``x`` is a torch tensor (never imports torch: a tensor means it is imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def platform_for_device(device_type, name="local_logits"):
    """The registry platform of a torch device type: "cpu" or "cuda"; anything else raises."""
    if device_type in PLATFORMS:
        return device_type
    raise LogprobContractError(
        f"{name} must be a CPU or CUDA tensor (or a NumPy array); got device type "
        f"{device_type!r}")


def platform_of(x, name="local_logits"):
    """Where ``x`` lives: "cuda" for a CUDA torch tensor, "cpu" for a CPU tensor or NumPy."""
    if is_tensor(x):
        return platform_for_device(x.device.type, name)
    return "cpu"


@contextlib.contextmanager
def on_device(x, platform):
    """For a CUDA tensor: its device is current while the C++ kernels run (they use the current
    device), and work queued on torch's current stream is finished before they read it (they run
    on the legacy default stream and return when done). Nothing on the cpu platform."""
    if platform != "cuda":
        yield
        return
    torch = sys.modules["torch"]
    with torch.cuda.device(x.device):
        torch.cuda.current_stream(x.device).synchronize()
        yield


def tensor_view(x, dtype):
    """The raw view of a 2-D strided tensor already checked (dtype: its detlogp name)."""
    rows, cols = x.shape
    s0 = x.stride(0)
    return x.data_ptr(), dtype, rows, cols, s0 if rows > 1 else max(s0, cols)


def raw_view(x, name="local_logits", shape=" [num_tokens, local_vocab]"):
    """(address, dtype, rows, cols, row_stride) of a 2-D buffer, checked: a strided torch tensor
    or a NumPy array of a supported dtype, contiguous in its last dimension (any row stride)."""
    if is_tensor(x):
        platform_of(x, name)
        if x.layout != sys.modules["torch"].strided:
            raise LogprobContractError(f"{name} must be a strided tensor; got {x.layout}")
        dtype = name_of_tensor(x, name)
        if x.dim() != 2:
            raise LogprobContractError(f"{name} must be 2-D{shape}; got shape {tuple(x.shape)}")
        strides = x.stride()
    elif isinstance(x, np.ndarray):
        dtype = name_of_array(x, name)
        if x.ndim != 2:
            raise LogprobContractError(f"{name} must be 2-D{shape}; got shape {x.shape}")
        item = x.itemsize
        if any(s % item for s in x.strides) or any(s < 0 for s in x.strides):
            raise LogprobContractError(
                f"{name} strides {x.strides} must be non-negative multiples of the "
                f"element size {item}")
        strides = x.strides[0] // item, x.strides[1] // item
    else:
        raise LogprobContractError(
            f"{name} must be a torch.Tensor or a numpy.ndarray; got {type(x).__name__}")
    rows, cols = x.shape
    if rows > 0 and cols > 1 and strides[1] != 1:  # (no rows: nothing is read, strides are moot)
        raise LogprobContractError(
            f"{name} must be contiguous in its last dimension (any row stride); got "
            f"strides {tuple(strides)} in elements. detlogp never copies its inputs: pass "
            f"{name}.contiguous() explicitly if a copy is acceptable")
    if is_tensor(x):
        return tensor_view(x, dtype)
    row_stride = strides[0] if rows > 1 else max(strides[0], cols)
    return x.__array_interface__["data"][0], dtype, rows, cols, row_stride


def int64_targets(t):
    """target_ids as a contiguous int64 NumPy array (a small [tokens] copy is fine)."""
    if is_tensor(t):
        torch = sys.modules["torch"]
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise LogprobContractError(f"target_ids must hold integers; got dtype {t.dtype}")
        if t.layout != torch.strided:  # sparse: what torch raises on it depends on its version
            raise LogprobContractError(
                f"target_ids must be a strided (dense) tensor; got {t.layout}: pass "
                f"target_ids.to_dense()")
        if t.dim() != 1:
            raise LogprobContractError(
                f"target_ids must be 1-D with one entry per token; got shape {tuple(t.shape)}")
        return t.detach().to(device="cpu", dtype=torch.int64).contiguous().numpy()
    a = np.asarray(t)
    if a.dtype.kind not in "iu":
        raise LogprobContractError(f"target_ids must hold integers; got dtype {a.dtype}")
    if a.ndim != 1:
        raise LogprobContractError(
            f"target_ids must be 1-D with one entry per token; got shape {a.shape}")
    if a.dtype.kind == "u" and a.dtype.itemsize >= 8 and a.size and int(a.max()) > 2**63 - 1:
        raise LogprobContractError(
            f"target_ids must fit in int64; got {int(a.max())} (dtype {a.dtype})")
    return np.ascontiguousarray(a, dtype=np.int64)


def grad_array(g):
    """An incoming per-token gradient as a contiguous fp32 NumPy array, or None."""
    if g is None:
        return None
    if is_tensor(g):
        return g.detach().to(device="cpu", dtype=sys.modules["torch"].float32).contiguous().numpy()
    return np.ascontiguousarray(g, dtype=np.float32)


def kernel_threads(threads, x):
    """The kernels' thread count: ``None`` means torch's (``torch.get_num_threads()``) for
    torch input and 0 (all hardware threads) for NumPy input."""
    if threads is None:
        return sys.modules["torch"].get_num_threads() if is_tensor(x) else 0
    threads = check_int(threads, "threads", "non-negative")
    if not 0 <= threads <= 4096:
        raise LogprobContractError(
            f"threads must be 0 (all hardware threads) or a count up to 4096; got {threads}")
    return threads
