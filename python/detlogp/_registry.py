"""Backend registration from Python, on the C++ registry (docs/dispatch.md, docs/python.md).

    reg = detlogp.Registry()                      # empty: for tests and embedders
    reg = detlogp.Registry.with_builtin_backends()
    reg = detlogp.Registry.default()              # the process-wide registry
    reg.register_logprob_backend(detlogp.Backend("MY_OP", MyOp), capability, prepend=True)
    d = reg.get_logprob_op(contract, requested_backend="auto")

A ``Registry`` wraps a C++ ``detlogp::Registry``: policies, capability matching per platform,
fallback, provenance, the shared instance cache and the load-failure blacklist are the C++
ones, so a Python caller and a C++ caller of one registry see the same dispatch. A backend is
a ``Backend(name, factory)``: ``factory()`` is called once, the first time dispatch picks the
backend, and returns either a detlogp op (``Backend.cpu(...)`` builds those) or any Python
object with ``forward`` and ``backward`` (a Python-defined backend, handed back as is). A
factory that raises, or returns None or something without forward/backward, counts as "could
not be loaded or instantiated" and is never called again by that registry.
"""

from . import _detlogp
from ._contract import LogprobBackendCapability, LogprobContract
from ._detlogp import LogprobContractError

__all__ = ["Backend", "Registry", "register_logprob_backend", "get_op", "PLATFORMS", "OP_KINDS"]

#: Platforms the registry keeps candidate lists for.
PLATFORMS = tuple(_detlogp.REGISTRY_PLATFORMS)
#: Op kinds the registry keeps candidate lists for: "logits" (the logits operator) and
#: "fused_linear" (the fused lm_head).
OP_KINDS = tuple(_detlogp.REGISTRY_OP_KINDS)


def _current_platform():
    """The platform a registration without ``platform=`` goes to: "cpu" (dispatch on "cuda" is
    asked for explicitly, or by CUDA logits)."""
    return "cpu"


def _platform(value):
    if value is None:
        return _current_platform()
    if not isinstance(value, str):
        raise LogprobContractError(
            f"platform must be a string, one of {list(PLATFORMS)}; got {value!r}")
    return value  # the C++ registry rejects unknown names ("unsupported platform ...")


class Backend:
    """A registry entry: a stable ``name`` (like "CPU_CANONICAL_VOCAB_PARALLEL_LOGP") and a
    ``factory`` called with no arguments the first time dispatch picks it.

    ``factory()`` returns a detlogp op (a ``LogprobOp`` from ``get_logprob_op`` or one built by
    ``Backend.cpu``) or a Python object with ``forward`` and ``backward`` methods; its optional
    ``backend_id`` and ``kernel_name`` attributes go into the provenance.
    """

    __slots__ = ("name", "_cpp")

    def __init__(self, name, factory):
        if not isinstance(name, str) or not name.strip():
            raise LogprobContractError("backend must be a Backend with a non-empty name and a "
                                       "factory")
        if not callable(factory):
            raise LogprobContractError(f"backend factory for {name} must be callable "
                                       "(returning an op object)")

        def make():
            made = factory()
            cpp = getattr(made, "_cpp", None)  # a detlogp LogprobOp wrapper: the C++ op itself
            return cpp if isinstance(cpp, _detlogp.LogprobOp) else made

        self.name = name
        self._cpp = _detlogp.Backend(name, make)

    @classmethod
    def cpu(cls, name, backend_id, kernels="canonical"):
        """One of detlogp's CPU operators under another name and id: ``kernels`` is
        "canonical" (SIMD), "reference" (scalar; the same bits) or "batch_invariant" (the
        single-shard op)."""
        self = object.__new__(cls)
        self.name = name
        self._cpp = _detlogp.Backend.cpu(name=name, backend_id=backend_id, kernels=kernels)
        return self

    def __repr__(self):
        return f"Backend({self.name!r})"


def _check_backend(backend):
    if not isinstance(backend, Backend):
        raise LogprobContractError(f"backend must be a Backend; got {type(backend).__name__}")
    return backend._cpp


def _check_capability(capability):
    if capability is None:
        return None  # the C++ registry's "capability must be a BackendCapability (got none)"
    if not isinstance(capability, LogprobBackendCapability):
        raise LogprobContractError(
            f"capability must be a LogprobBackendCapability; got {type(capability).__name__}")
    return capability._cpp


def _op_of(cpp_op, requested_backend="auto", platform="cpu"):
    from ._op import LogprobOp

    py_op = _detlogp.python_op_of(cpp_op)
    return py_op if py_op is not None else LogprobOp(cpp_op, requested_backend, platform)


class Registry:
    """Contract-aware dispatch over registered backends (a C++ ``detlogp::Registry``).

    ``Registry()`` is empty; ``Registry.with_builtin_backends()`` holds detlogp's CPU backends
    in their usual order; ``Registry.default()`` is the process-wide registry that
    ``detlogp.get_logprob_op`` dispatches through. Thread-safe.
    """

    __slots__ = ("_cpp", "_is_default")

    def __init__(self):
        self._cpp = _detlogp.Registry()
        self._is_default = False

    @classmethod
    def _wrap(cls, cpp, is_default=False):
        self = object.__new__(cls)
        self._cpp = cpp
        self._is_default = is_default
        return self

    @classmethod
    def with_builtin_backends(cls):
        return cls._wrap(_detlogp.Registry.with_builtin_backends())

    @classmethod
    def default(cls):
        return cls._wrap(_detlogp.Registry.global_registry(), is_default=True)

    def __repr__(self):
        which = "default" if self._is_default else hex(id(self))
        return f"Registry({which}, cpu={self.contract_candidates('cpu')})"

    # --- registration ---------------------------------------------------------------------

    def register_logprob_backend(self, backend, capability, *, platform=None, prepend=False):
        """Declares (or replaces) ``backend``'s capability on ``platform`` (None: "cpu") and
        adds it to that platform's candidate list (at the front with ``prepend``) unless it is
        there already: re-registering keeps the position and swaps the capability. Never
        touches the legacy lists."""
        cpp_backend = _check_backend(backend)
        cap = _check_capability(capability)
        if type(prepend) is not bool:
            raise LogprobContractError(f"prepend must be a bool; got {prepend!r}")
        self._cpp.register_logprob_backend(cpp_backend, cap, _platform(platform), prepend)

    def add_contract_candidate(self, backend, *, platform=None):
        """Adds ``backend`` to a candidate list without a capability (dispatch then records
        "no LogprobBackendCapability declared" for it)."""
        self._cpp.add_contract_candidate(_check_backend(backend), _platform(platform))

    def register_legacy_backend(self, op_type, backend, *, platform=None, prepend=False):
        """The legacy per-(op type, platform) priority list that ``get_op`` walks."""
        if not isinstance(op_type, str):
            raise LogprobContractError(f"op_type must be a string; got {op_type!r}")
        if type(prepend) is not bool:
            raise LogprobContractError(f"prepend must be a bool; got {prepend!r}")
        self._cpp.register_legacy_backend(op_type, _check_backend(backend), _platform(platform),
                                          prepend)

    # --- dispatch -------------------------------------------------------------------------

    def get_logprob_op(self, contract, requested_backend="auto", *, platform="cpu"):
        """Contract dispatch: a ``LogprobDispatchResult`` (unpacks as ``op, provenance``).

        Same policies, fallback and provenance as the C++ ``Registry::get_logprob_op``. The op is
        a detlogp ``LogprobOp``, or the object a Python-defined backend's factory returned.
        """
        from ._op import LogprobDispatchResult, get_logprob_op

        if self._is_default:
            return get_logprob_op(contract, requested_backend, platform=platform)
        if not isinstance(contract, LogprobContract):
            raise LogprobContractError("contract must be a LogprobContract")
        if not isinstance(requested_backend, str):
            raise LogprobContractError("requested_backend must be a non-empty string")
        d = self._cpp.get_logprob_op(contract._cpp, requested_backend, _platform(platform))
        return LogprobDispatchResult(d)

    def get_op(self, op_type, device=None):
        """The legacy path: the first backend of ``op_type``'s priority list on the device's
        platform (None: "cpu"; a torch.device or "cuda:0" style string) that loads, else
        RuntimeError "No functional backend found for <op> on <platform>"."""
        if device is None:
            platform = _current_platform()
        else:
            platform = getattr(device, "type", None) or str(device).split(":", 1)[0]
        return _op_of(self._cpp.get_op(op_type, platform), "auto", platform)

    # --- introspection --------------------------------------------------------------------

    def contract_candidates(self, platform="cpu", op_kind="logits"):
        """The candidate list of ``op_kind`` (one of ``OP_KINDS``: "logits", the
        logits operator; "fused_linear", the fused lm_head) on ``platform``, in dispatch
        order."""
        if not isinstance(op_kind, str):
            raise LogprobContractError(f"op_kind must be a string; got {op_kind!r}")
        return list(self._cpp.contract_candidates(_platform(platform), op_kind))

    def legacy_priority(self, op_type, platform="cpu"):
        return list(self._cpp.legacy_priority(op_type, _platform(platform)))

    def capability(self, platform, backend_name):
        """The capability ``backend_name`` declared on ``platform``, or None."""
        cap = self._cpp.capability(_platform(platform), backend_name)
        return None if cap is None else LogprobBackendCapability._from_cpp(cap)

    def failed_to_load(self, backend_name):
        return bool(self._cpp.failed_to_load(backend_name))


def register_logprob_backend(backend, capability, *, platform=None, prepend=False):
    """``Registry.default().register_logprob_backend(...)``."""
    Registry.default().register_logprob_backend(backend, capability, platform=platform,
                                                prepend=prepend)


def get_op(op_type, device=None):
    """``Registry.default().get_op(...)`` (the legacy path)."""
    return Registry.default().get_op(op_type, device)
