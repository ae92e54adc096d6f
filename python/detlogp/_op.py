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

import json

from . import _detlogp
from ._buffers import PLATFORMS, int64_targets, is_tensor, kernel_threads, platform_of, raw_view
from ._call import LogitsCall, LogprobForward
from ._checks import check_bool
from ._comm import communicator_for, peers_fail_on_error
from ._contract import LogprobBackendCapability, LogprobContract
from ._detlogp import LogprobContractError

__all__ = ["LogprobOp", "LogprobForward", "LogprobDispatchResult", "get_logprob_op",
           "cuda_status"]


def cuda_status():
    """``(built, device_count, reason)``: whether this detlogp has the CUDA backend, how many CUDA
    devices it sees, and why none (empty when there is one). Starts nothing on the GPU."""
    built, count, why = _detlogp.cuda_backend_status()
    return bool(built), int(count), str(why)


def _check_call(contract, deterministic, validate, entropy, entropy_grad=True):
    if not isinstance(contract, LogprobContract):
        raise LogprobContractError("contract must be a LogprobContract")
    check_bool(deterministic, "deterministic")
    check_bool(validate, "validate")
    check_bool(entropy, "entropy")
    check_bool(entropy_grad, "entropy_grad")


class _Differentiable:
    """The object API's call as autograd sees it (_autograd.py): logits -> (logp, lse[,
    entropy]); backward: the C++ backward, in the logits dtype."""

    __slots__ = ("call", "fwd", "constant_outputs")

    def __init__(self, call):
        self.call = call
        self.fwd = None
        # entropy_grad=False: the entropy is a logged metric, without a gradient.
        self.constant_outputs = (2,) if call.entropy and not call.entropy_grad else ()

    def forward(self, inputs):
        fwd = self.call.run()
        outputs = fwd.outputs()
        # Kept: what backward needs, not the outputs (no reference cycle through them).
        fwd.logp = fwd.lse = fwd.entropy = None
        self.fwd = fwd
        return outputs

    def backward(self, inputs, grads, needs):
        return (self.fwd.backward(*grads),)


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

    def _prepare(self, local_logits, target_ids, contract, group, deterministic, validate,
                 entropy, entropy_grad, threads, rows_layout):
        """The ``LogitsCall`` of one call, every input checked and converted once; a failure
        fails the peers (they wait in the preflight)."""
        with peers_fail_on_error(group):
            _check_call(contract, deterministic, validate, entropy, entropy_grad)
            threads = kernel_threads(threads, local_logits)
            view = raw_view(local_logits)
            targets = int64_targets(target_ids)
            platform = platform_of(local_logits)
            cpp, backend_id = self._op_for(platform, contract)
            try:
                comm = communicator_for(group, contract.sharding.tp_world_size)
            except LogprobContractError:
                # The C++ order: contract and shape checks before the transport's.
                _detlogp.check_forward_inputs(logits=view, targets=targets,
                                              contract=contract._cpp,
                                              deterministic=deterministic)
                raise
        return LogitsCall(cpp=cpp, backend_id=backend_id, platform=platform,
                          logits=local_logits, view=view, targets=targets, contract=contract,
                          comm=comm, deterministic=deterministic, validate=validate,
                          entropy=entropy, entropy_grad=entropy_grad, threads=threads,
                          rows_layout=rows_layout)

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
        return self._prepare(local_logits, target_ids, contract, group, deterministic, validate,
                             entropy, entropy_grad, threads, rows_layout).run()

    def __call__(self, local_logits, target_ids, *, contract, group=None, deterministic=True,
                 validate=True, entropy=False, entropy_grad=True, threads=None):
        """``(logp, lse)`` or ``(logp, lse, entropy)``, fp32 [tokens], replicated on every TP
        rank. Torch input gives torch tensors attached to autograd when the logits require
        grad (gradients in the logits dtype); NumPy input gives NumPy arrays.
        ``entropy_grad=False``: the entropy is returned without a gradient (non-differentiable
        in autograd)."""
        tensor = is_tensor(local_logits)
        grad = tensor and local_logits.requires_grad and _grad_enabled()
        logits = local_logits.detach() if tensor and not grad else local_logits
        call = self._prepare(logits, target_ids, contract, group, deterministic, validate,
                             entropy, entropy_grad, threads, "")
        if grad:
            from . import _autograd  # torch is imported: a tensor requires grad

            return _autograd.apply(_Differentiable(call), local_logits)
        return call.run().outputs()

    # The compatible names (docs/contract.md, "Compatibility").
    apply = __call__

    def apply_with_entropy(self, local_logits, target_ids, *, contract, group=None,
                           deterministic=True, validate=True, with_entropy_grad=True,
                           threads=None):
        return self(local_logits, target_ids, contract=contract, group=group,
                    deterministic=deterministic, validate=validate, entropy=True,
                    entropy_grad=with_entropy_grad, threads=threads)


def _grad_enabled():
    import torch  # a tensor was given: torch is imported

    return torch.is_grad_enabled()


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
