"""The vocab-parallel logprob op on NumPy arrays and torch tensors, with autograd.

``get_logprob_op(contract)`` dispatches through the C++ registry and returns a
``LogprobDispatchResult`` that unpacks as ``(op, provenance)``. The op is called as

    logp, lse = op(local_logits, target_ids, contract=contract, group=None)
    logp, lse, entropy = op(..., entropy=True)

The logits are never copied: the C++ operator reads the caller's buffer (any row stride, last
dimension contiguous) and backward reads it again, so the logits must stay alive and
unchanged until backward is done (for torch tensors that require grad, autograd keeps them
alive and refuses a backward after an in-place change).

Where the logits live picks the registry platform: CPU tensors and NumPy arrays run on "cpu",
CUDA torch tensors on "cuda" (the CUDA backend, docs/cuda.md: the same bits as the CPU; only in
a build with CUDA, else LogprobContractError). An op dispatched for one platform given logits
on the other is dispatched again, with the same contract and request, for the logits' platform.
"""

import contextlib

import json

import numpy as np

from . import _detlogp
from ._checks import check_bool, check_int
from ._comm import communicator_for, exclusive, fail_peers
from ._contract import LogprobBackendCapability, LogprobContract
from ._detlogp import LogprobContractError
from ._storage import check_stamp, stamp

__all__ = ["LogprobOp", "LogprobForward", "LogprobDispatchResult", "get_logprob_op",
           "cuda_status"]

_NUMPY_DTYPES = {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}
PLATFORMS = ("cpu", "cuda")


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    return torch


def _is_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtype_name(dtype):
    torch = _torch()
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype)


def _platform_for_device(device_type, name="local_logits"):
    """The registry platform of a torch device type: "cpu" or "cuda"; anything else raises."""
    if device_type in PLATFORMS:
        return device_type
    raise LogprobContractError(
        f"{name} must be a CPU or CUDA tensor (or a NumPy array); got device type "
        f"{device_type!r}")


def _platform_of(x, name="local_logits"):
    """Where the logits live: "cuda" for a CUDA torch tensor, "cpu" for a CPU tensor or NumPy."""
    if _is_tensor(x):
        return _platform_for_device(x.device.type, name)
    return "cpu"


def cuda_status():
    """``(built, device_count, reason)``: whether this detlogp has the CUDA backend, how many CUDA
    devices it sees, and why none (empty when there is one). Starts nothing on the GPU."""
    built, count, why = _detlogp.cuda_backend_status()
    return bool(built), int(count), str(why)


def _check_cuda_built():
    if not _detlogp.CUDA_BUILT:
        raise LogprobContractError(
            "CUDA logits need the CUDA backend, but this detlogp was built without CUDA (no "
            "CUDA compiler, or DETLOGP_WITH_CUDA=OFF); pass CPU tensors or rebuild with CUDA")


@contextlib.contextmanager
def _on_device(x):
    """For a CUDA tensor: its device is current while the C++ kernels run (they use the current
    device), and work queued on torch's current stream is finished before they read it (they run
    on the legacy default stream and return when done). Nothing for CPU tensors and NumPy."""
    if _platform_of(x) != "cuda":
        yield
        return
    torch = _torch()
    with torch.cuda.device(x.device):
        torch.cuda.current_stream(x.device).synchronize()
        yield


def _logits_view(x, name="local_logits", shape=" [num_tokens, local_vocab]"):
    """(address, dtype, rows, cols, row_stride) of a 2-D buffer (the logits, or the fused lm_head's
    hidden states and weight), without copying (a CUDA tensor gives its device address)."""
    if _is_tensor(x):
        _platform_of(x)
        if x.layout != _torch().strided:
            raise LogprobContractError(f"{name} must be a strided tensor; got {x.layout}")
        dtype = _torch_dtype_name(x.dtype)
        if dtype is None:
            raise LogprobContractError(
                f"{name} dtype {x.dtype} is not supported; expected torch.bfloat16, "
                "torch.float16 or torch.float32")
        if x.dim() != 2:
            raise LogprobContractError(f"{name} must be 2-D{shape}; got shape {tuple(x.shape)}")
        rows, cols = x.shape
        s0, s1 = x.stride()
        address = x.data_ptr()
    elif isinstance(x, np.ndarray):
        dtype = _NUMPY_DTYPES.get(x.dtype)
        if dtype is None:
            raise LogprobContractError(
                f"{name} dtype {x.dtype} is not supported; expected float16 or float32 "
                "(bf16: pass a torch.bfloat16 tensor)")
        if x.ndim != 2:
            raise LogprobContractError(f"{name} must be 2-D{shape}; got shape {x.shape}")
        rows, cols = x.shape
        item = x.itemsize
        if any(s % item for s in x.strides) or any(s < 0 for s in x.strides):
            raise LogprobContractError(
                f"{name} strides {x.strides} must be non-negative multiples of the "
                f"element size {item}")
        s0, s1 = x.strides[0] // item, x.strides[1] // item
        address = x.__array_interface__["data"][0]
    else:
        raise LogprobContractError(
            f"{name} must be a torch.Tensor or a numpy.ndarray; got {type(x).__name__}")
    if rows > 0 and cols > 1 and s1 != 1:  # (no rows: nothing is read, strides are moot)
        raise LogprobContractError(
            f"{name} must be contiguous in its last dimension (any row stride); got "
            f"strides {(s0, s1)} in elements. detlogp never copies its inputs: pass "
            f"{name}.contiguous() explicitly if a copy is acceptable")
    row_stride = s0 if rows > 1 else max(s0, cols)
    return address, dtype, rows, cols, row_stride


def _targets(t):
    """target_ids as a contiguous int64 NumPy array (a small [tokens] copy is fine)."""
    if _is_tensor(t):
        torch = _torch()
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise LogprobContractError(f"target_ids must hold integers; got dtype {t.dtype}")
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


def _grad_array(g):
    """An incoming per-token gradient as a contiguous fp32 NumPy array, or None."""
    if g is None:
        return None
    if _is_tensor(g):
        return g.detach().to(device="cpu", dtype=_torch().float32).contiguous().numpy()
    return np.ascontiguousarray(g, dtype=np.float32)


class LogprobForward:
    """The outputs of one forward (``logp``, ``lse``, ``entropy`` or None; torch tensors for
    torch input, NumPy arrays for NumPy input) and ``backward()`` for this rank's shard.

    Holds a reference to the logits: they must stay unchanged until backward is done, and
    their storage allocated where it was (checked: detlogp/_storage.py).
    """

    __slots__ = ("_handle", "_logits", "_stamp", "_torch_out", "platform", "backend_id", "logp",
                 "lse", "entropy")

    def __init__(self, handle, logits, platform="cpu", backend_id=None):
        self._handle = handle
        self._logits = logits
        self._stamp = stamp(logits)
        self._torch_out = _is_tensor(logits)
        self.platform = platform  # "cpu" or "cuda": where it ran
        self.backend_id = backend_id  # the backend that ran
        if self._torch_out and platform == "cuda":
            device = logits.device

            def convert(a):
                return _torch().from_numpy(a).to(device)
        elif self._torch_out:
            convert = _torch().from_numpy
        else:
            def convert(a):
                return a
        self.logp = convert(handle.logp)
        self.lse = convert(handle.lse)
        ent = handle.entropy
        self.entropy = None if ent is None else convert(ent)

    @property
    def saved_logits_data_ptr(self):
        """Address of the logits buffer backward reads: the caller's (no copy was made)."""
        return self._handle.saved_logits_data_ptr

    def outputs(self):
        if self.entropy is None:
            return self.logp, self.lse
        return self.logp, self.lse, self.entropy

    def backward(self, grad_logp=None, grad_lse=None, grad_entropy=None, out=None):
        """Gradient of this rank's logits shard for the given per-token output gradients
        (None: not supplied). Returns a new array/tensor of the logits' shape and dtype (a
        torch tensor may reuse the memory of an earlier gradient that nothing refers to any
        more), or writes into ``out``, which must have that shape and dtype. No collective."""
        x = self._logits
        check_stamp(x, self._stamp, "the logits")
        if out is None:
            if self._torch_out:
                # A pooled buffer where one is free (no page faults on first touch), else a
                # fresh one (detlogp/_call_cache.py).
                from ._call_cache import DEFAULT_CACHE

                out = DEFAULT_CACHE.grad_buffer(x.shape[0], x.shape[1], x.dtype, x.device)
            else:
                out = np.empty(x.shape, dtype=x.dtype)
        if _is_tensor(out):
            _platform_of(out, "out")
        address, dtype, rows, cols, row_stride = _logits_view(out)
        if _is_tensor(out) and out.requires_grad:
            raise LogprobContractError("out must not require grad")
        if isinstance(out, np.ndarray) and not out.flags.writeable:
            raise LogprobContractError("out must be writeable")
        if self.platform == "cuda" and (not _is_tensor(out) or out.device != x.device):
            where = out.device if _is_tensor(out) else "a NumPy array"
            raise LogprobContractError(
                f"out must live on the logits' device {x.device}; got {where}")
        if self.platform == "cpu" and _platform_of(out, "out") != "cpu":
            raise LogprobContractError(
                f"out must be a CPU tensor or a NumPy array like the logits; got {out.device}")
        grads = dict(grad_logp=_grad_array(grad_logp), grad_lse=_grad_array(grad_lse),
                     grad_entropy=_grad_array(grad_entropy))
        with _on_device(out):
            self._handle.backward(**grads, out_ptr=address, out_dtype=dtype, out_rows=rows,
                                  out_cols=cols, out_row_stride=row_stride)
        return out


def is_layout_disagreement(error):
    """Whether ``error`` is the preflight's "ranks disagree on the rows layout" (every rank of
    the call got it, from the same records)."""
    return isinstance(error, LogprobContractError) and \
        getattr(error, "field", "") == "rows_layout"


def rejoin_on_layout(call, again):
    """``call()``; when its preflight reports that the ranks' rows layouts differ, every rank
    joins one more preflight: ``again()``, the same call with this rank's rows in token order
    (the same call again where they already are). Any other error propagates."""
    try:
        return call()
    except LogprobContractError as error:
        if not is_layout_disagreement(error):
            raise
    return again()


def _threads(threads, x):
    """The kernels' thread count: ``None`` means torch's (``torch.get_num_threads()``) for
    torch input and 0 (all hardware threads) for NumPy input."""
    if threads is None:
        return _torch().get_num_threads() if _is_tensor(x) else 0
    threads = check_int(threads, "threads", "non-negative")
    if not 0 <= threads <= 4096:
        raise LogprobContractError(
            f"threads must be 0 (all hardware threads) or a count up to 4096; got {threads}")
    return threads


def _check_call(contract, deterministic, validate, entropy, entropy_grad=True):
    if not isinstance(contract, LogprobContract):
        raise LogprobContractError("contract must be a LogprobContract")
    check_bool(deterministic, "deterministic")
    check_bool(validate, "validate")
    check_bool(entropy, "entropy")
    check_bool(entropy_grad, "entropy_grad")


def _make_function():
    torch = _torch()
    from torch.autograd.function import once_differentiable

    class LogprobFunction(torch.autograd.Function):
        """logits -> (logp, lse[, entropy]); backward: the C++ backward, in the logits dtype."""

        @staticmethod
        def forward(ctx, logits, run, constant_entropy=False):
            fwd = run(logits)
            outputs = fwd.outputs()
            if constant_entropy and len(outputs) == 3:  # entropy_grad=False: a logged metric
                ctx.mark_non_differentiable(outputs[2])
            # ctx keeps what backward needs, not the outputs (no reference cycle through them).
            fwd.logp = fwd.lse = fwd.entropy = None
            ctx.fwd = fwd
            ctx.save_for_backward(logits)  # keeps it alive; detects in-place changes
            ctx.set_materialize_grads(False)
            return outputs

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_logp, grad_lse, grad_entropy=None):
            ctx.saved_tensors  # raises if the logits were modified in place since forward
            if grad_logp is None and grad_lse is None and grad_entropy is None:
                return None, None, None
            grad = ctx.fwd.backward(grad_logp, grad_lse, grad_entropy)
            return grad, None, None

    return LogprobFunction


_FUNCTION = None


def _function():
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _make_function()
    return _FUNCTION


class LogprobOp:
    """A logprob backend handed out by ``get_logprob_op`` (a C++ LogprobOp)."""

    __slots__ = ("_cpp", "_requested", "_platform")

    def __init__(self, cpp_op, requested_backend="auto", platform="cpu"):
        self._cpp = cpp_op
        self._requested = requested_backend  # what get_logprob_op was asked for
        self._platform = platform  # the platform it was dispatched on

    @property
    def platform(self):
        """The registry platform this op was dispatched on ("cpu" or "cuda")."""
        return self._platform

    def _op_for(self, platform, contract):
        """(C++ op, backend id) for logits on `platform`: this op, or the same request
        dispatched again on the logits' platform."""
        if platform == self._platform:
            return self._cpp, self._cpp.backend_id
        d = _dispatch(contract, self._requested, platform)
        return d.op, d.actual_backend

    @property
    def backend_id(self):
        return self._cpp.backend_id

    @property
    def kernel_name(self):
        """The kernels that run (e.g. "highway:AVX2", "scalar-reference")."""
        return self._cpp.kernel_name

    def __repr__(self):
        return f"LogprobOp(backend_id={self.backend_id!r}, kernels={self.kernel_name!r})"

    def forward(self, local_logits, target_ids, *, contract, group=None, deterministic=True,
                validate=True, entropy=False, threads=None, entropy_grad=True, rows_layout=""):
        """One forward without autograd: a ``LogprobForward`` (outputs + explicit backward).

        ``threads``: CPU threads of the kernels, forward and backward (0: all; None: torch's
        ``torch.get_num_threads()`` for torch input, all for NumPy); the bits never depend on
        it. ``entropy_grad=False``: the entropy is a constant for backward (which then rejects
        a ``grad_entropy``); the outputs' bits are the same. ``rows_layout``: which of the
        caller's tokens each row is when they are not the tokens in order (``detlogp.torch``
        sets it for N-D views; "" here: row i is token i). The preflight compares it across
        ranks; when they differ every rank raises LogprobContractError (field "rows_layout"),
        except that a rank whose rows are the tokens in order joins once more, as the ranks
        with another layout do once they have their rows in token order.
        """
        try:
            _check_call(contract, deterministic, validate, entropy, entropy_grad)
            threads = _threads(threads, local_logits)
            address, dtype, rows, cols, row_stride = _logits_view(local_logits)
            targets = _targets(target_ids)
            platform = _platform_of(local_logits)
            cpp, backend_id = self._op_for(platform, contract)
            try:
                comm = communicator_for(group, contract.sharding.tp_world_size)
            except LogprobContractError:
                # The C++ order: contract and shape checks before the transport's.
                _detlogp.check_forward_inputs(
                    ptr=address, dtype=dtype, rows=rows, cols=cols, row_stride=row_stride,
                    targets=targets, contract=contract._cpp, deterministic=deterministic)
                raise
        except Exception as error:
            fail_peers(group, error)
            raise
        def call():
            with _on_device(local_logits):
                return cpp.forward(
                    ptr=address, dtype=dtype, rows=rows, cols=cols, row_stride=row_stride,
                    owner=local_logits, targets=targets, contract=contract._cpp, comm=comm,
                    deterministic=deterministic, validate=validate, entropy=entropy,
                    threads=threads, entropy_grad=entropy_grad, rows_layout=rows_layout)

        with exclusive(comm):  # both preflights of a rejoin, too
            handle = call() if rows_layout else rejoin_on_layout(call, call)
        return LogprobForward(handle, local_logits, platform, backend_id)

    def __call__(self, local_logits, target_ids, *, contract, group=None, deterministic=True,
                 validate=True, entropy=False, entropy_grad=True, threads=None):
        """``(logp, lse)`` or ``(logp, lse, entropy)``, fp32 [tokens], replicated on every TP
        rank. Torch input gives torch tensors attached to autograd when the logits require
        grad (gradients in the logits dtype); NumPy input gives NumPy arrays.
        ``entropy_grad=False``: the entropy is returned without a gradient (non-differentiable
        in autograd)."""
        try:
            _check_call(contract, deterministic, validate, entropy, entropy_grad)
            threads = _threads(threads, local_logits)
        except Exception as error:
            fail_peers(group, error)
            raise
        torch = _torch() if _is_tensor(local_logits) else None
        if torch is not None and local_logits.requires_grad and torch.is_grad_enabled():

            def run(logits):
                return self.forward(logits, target_ids, contract=contract, group=group,
                                    deterministic=deterministic, validate=validate,
                                    entropy=entropy, entropy_grad=entropy_grad,
                                    threads=threads)

            return _function().apply(local_logits, run, entropy and not entropy_grad)
        logits = local_logits.detach() if torch is not None else local_logits
        return self.forward(logits, target_ids, contract=contract, group=group,
                            deterministic=deterministic, validate=validate,
                            entropy=entropy, entropy_grad=entropy_grad,
                            threads=threads).outputs()

    # The compatible names (docs/contract.md, "Compatibility").
    apply = __call__

    def apply_with_entropy(self, local_logits, target_ids, *, contract, group=None,
                           deterministic=True, validate=True, with_entropy_grad=True,
                           threads=None):
        return self(local_logits, target_ids, contract=contract, group=group,
                    deterministic=deterministic, validate=validate, entropy=True,
                    entropy_grad=with_entropy_grad, threads=threads)


class LogprobDispatchResult:
    """What ``get_logprob_op`` returns. Unpacks as ``op, provenance = get_logprob_op(c)``.

    Attributes: ``op`` (LogprobOp), ``capability`` (LogprobBackendCapability), ``provenance``
    (dict, JSON-serializable: requested_backend, actual_backend, backend_enum, platform,
    fallback, prior_rejections, contract, capability, numerics version, kernel), and the
    shortcuts ``requested_backend``, ``actual_backend``, ``platform``, ``fallback``,
    ``prior_rejections``.
    """

    __slots__ = ("op", "capability", "provenance", "requested_backend", "actual_backend",
                 "backend_name", "platform", "fallback", "prior_rejections")

    def __init__(self, d):
        py_op = _detlogp.python_op_of(d.op)  # a Python-defined backend: its own object
        self.op = py_op if py_op is not None else LogprobOp(d.op, d.requested_backend, d.platform)
        self.capability = LogprobBackendCapability._from_cpp(d.capability)
        self.provenance = json.loads(d.provenance_json)
        self.requested_backend = d.requested_backend
        self.actual_backend = d.actual_backend
        self.backend_name = d.backend_name
        self.platform = d.platform
        self.fallback = d.fallback
        self.prior_rejections = tuple(d.prior_rejections)

    def __iter__(self):
        return iter((self.op, self.provenance))

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return (self.op, self.provenance)[i]

    def __repr__(self):
        return (f"LogprobDispatchResult(actual_backend={self.actual_backend!r}, "
                f"fallback={self.fallback})")


def _dispatch(contract, requested_backend, platform):
    """The C++ DispatchResult of `contract` on `platform` ("cpu" or "cuda")."""
    if platform not in PLATFORMS:
        raise LogprobContractError(f"platform must be 'cpu' or 'cuda'; got {platform!r}")
    if platform == "cuda":
        _check_cuda_built()
    return _detlogp.get_logprob_op(contract._cpp, requested_backend, platform)


def get_logprob_op(contract, requested_backend="auto", *, platform="cpu"):
    """Contract dispatch (docs/dispatch.md) through the C++ registry.

    ``requested_backend``: "auto" (first fitting candidate), "production", "reference"
    (case-insensitive), or an exact backend id. ``platform``: "cpu" (default) or "cuda" (the
    CUDA backend; LogprobContractError where detlogp was built without CUDA or no device
    exists). The op also runs logits of the other platform (a CUDA tensor given to a cpu op is
    dispatched again on "cuda"). Raises LogprobContractError for a bad request and RuntimeError
    listing every rejection when no backend fits (never a silent fallback).
    """
    if not isinstance(contract, LogprobContract):
        raise LogprobContractError("contract must be a LogprobContract")
    if not isinstance(requested_backend, str):
        raise LogprobContractError("requested_backend must be a non-empty string")
    if not isinstance(platform, str):
        raise LogprobContractError(f"platform must be 'cpu' or 'cuda'; got {platform!r}")
    return LogprobDispatchResult(_dispatch(contract, requested_backend, platform))
