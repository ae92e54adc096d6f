"""The logprob contract types (docs/contract.md, docs/python.md).

Immutable value types with the class and field names of docs/contract.md, "Compatibility".
Each constructor does the
Python-side type checks (_checks.py) and hands the values to the C++ library, which validates
everything else and raises LogprobContractError with the same messages as in C++. ``to_dict()``
is the C++ ``to_json()`` parsed, and ``cross_rank_fingerprint()`` is the C++ one, so a Python
rank and a C++ rank of one call agree.
"""

import json
import sys

import numpy as np

from . import _detlogp
from ._checks import check_bool, check_int, check_optional_int, is_bool, is_int
from ._detlogp import LogprobContractError
from ._enums import (DeterminismScope, DowncastPoint, DType, Engine, ImplementationKind,
                     MaskMode, Merge, MergeAxis, ReductionOrder, Role, TPPlacement, Transport,
                     coerce_enum)

__all__ = [
    "ShardingSpec", "MaskSpec", "ReductionSpec", "LogprobOutputSpec", "OutputSpec",
    "LogprobContract", "LogprobBackendCapability", "even_bounds", "even_tile_aligned_bounds",
    "megatron_padded_vocab", "megatron_bounds",
]


def _rebuild(cls, kwargs):
    return cls(**kwargs)


class _Frozen:
    """Immutable wrapper of a C++ value: equality, hashing, pickling, repr and replace()."""

    __slots__ = ("_cpp",)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; use replace()")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _init(self, cpp, **fields):
        object.__setattr__(self, "_cpp", cpp)
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _kwargs(self):  # constructor arguments that rebuild this value
        raise NotImplementedError

    def replace(self, **changes):
        """A copy with some fields changed (like dataclasses.replace), validated again."""
        kwargs = self._kwargs()
        unknown = set(changes) - set(kwargs)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(unknown)}")
        kwargs.update(changes)
        return type(self)(**kwargs)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._cpp == other._cpp

    def __hash__(self):
        return hash((type(self).__name__, repr(self)))

    def __reduce__(self):
        return (_rebuild, (type(self), self._kwargs()))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs().items())
        return f"{type(self).__name__}({args})"


# ---------------------------------------------------------------------------------------------


def _bounds(value):
    """vocab_shard_bounds as a list of (start, end) int pairs (reads elements [0] and [1])."""
    bad = "vocab_shard_bounds must be an iterable of (start, end) integer pairs"
    if isinstance(value, (str, bytes)):
        raise LogprobContractError(bad)
    try:
        items = list(value)
    except TypeError:
        raise LogprobContractError(bad) from None
    pairs = []
    for r, item in enumerate(items):
        try:
            start, end = item[0], item[1]
        except (TypeError, IndexError, KeyError):
            raise LogprobContractError(bad) from None
        if not (is_int(start) and is_int(end)):
            raise LogprobContractError(
                f"vocab_shard_bounds[{r}] must be a pair of integers; got ({start!r}, {end!r})")
        pairs.append((check_int(start, f"vocab_shard_bounds[{r}]"),
                      check_int(end, f"vocab_shard_bounds[{r}]")))
    return pairs


class ShardingSpec(_Frozen):
    """Which TP rank holds which vocabulary columns."""

    __slots__ = ()

    def __init__(self, tp_rank, tp_world_size, vocab_shard_bounds, real_vocab_size,
                 padded_vocab_size, cp_rank=0, cp_world_size=1):
        tp_world_size = check_int(tp_world_size, "tp_world_size", "positive")
        tp_rank = check_int(tp_rank, "tp_rank", "non-negative")
        cp_world_size = check_int(cp_world_size, "cp_world_size", "positive")
        cp_rank = check_int(cp_rank, "cp_rank", "non-negative")
        real_vocab_size = check_int(real_vocab_size, "real_vocab_size", "positive")
        padded_vocab_size = check_int(padded_vocab_size, "padded_vocab_size", "positive")
        bounds = _bounds(vocab_shard_bounds)
        self._init(_detlogp.ShardingSpec(
            tp_rank=tp_rank, tp_world_size=tp_world_size, vocab_shard_bounds=bounds,
            real_vocab_size=real_vocab_size, padded_vocab_size=padded_vocab_size,
            cp_rank=cp_rank, cp_world_size=cp_world_size))

    @classmethod
    def _from_cpp(cls, cpp):
        self = object.__new__(cls)
        self._init(cpp)
        return self

    tp_rank = property(lambda self: self._cpp.tp_rank)
    tp_world_size = property(lambda self: self._cpp.tp_world_size)
    cp_rank = property(lambda self: self._cpp.cp_rank)
    cp_world_size = property(lambda self: self._cpp.cp_world_size)
    real_vocab_size = property(lambda self: self._cpp.real_vocab_size)
    padded_vocab_size = property(lambda self: self._cpp.padded_vocab_size)
    local_vocab_start = property(lambda self: self._cpp.local_vocab_start)
    local_vocab_end = property(lambda self: self._cpp.local_vocab_end)
    local_vocab_size = property(lambda self: self._cpp.local_vocab_size)

    @property
    def vocab_shard_bounds(self):
        """The full table, normalized to a tuple of (start, end) tuples."""
        return tuple(tuple(b) for b in self._cpp.vocab_shard_bounds)

    def owner_rank(self, token_id):
        """The TP rank whose shard holds ``token_id`` (a real-vocabulary token)."""
        return self._cpp.owner_rank(check_int(token_id, "token_id"))

    def _kwargs(self):
        return dict(tp_rank=self.tp_rank, tp_world_size=self.tp_world_size,
                    vocab_shard_bounds=self.vocab_shard_bounds,
                    real_vocab_size=self.real_vocab_size,
                    padded_vocab_size=self.padded_vocab_size, cp_rank=self.cp_rank,
                    cp_world_size=self.cp_world_size)


# ---------------------------------------------------------------------------------------------


def _mask_elements(value):
    """active_mask as a list of Python bools; every element must be a real bool."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional for contracts
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy() if value.dtype == torch.bool else value.tolist()
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise LogprobContractError("active_mask must be a 1-D iterable of booleans")
        if value.dtype == np.bool_:
            return [bool(x) for x in value]
        value = value.tolist()
    if isinstance(value, (str, bytes)):
        raise LogprobContractError("active_mask must be an iterable of booleans")
    try:
        items = list(value)
    except TypeError:
        raise LogprobContractError("active_mask must be an iterable of booleans") from None
    for i, x in enumerate(items):
        if not is_bool(x):
            raise LogprobContractError(f"active_mask[{i}] must be a bool; got {x!r}")
    return [bool(x) for x in items]


def _bool_bytes(value):
    """A 1-D bool NumPy array or torch tensor as contiguous uint8 (no per-element Python
    work: a 262k-token mask in well under a millisecond); None for anything else."""
    if isinstance(value, np.ndarray) and value.dtype == np.bool_ and value.ndim == 1:
        return np.ascontiguousarray(value).view(np.uint8)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.dtype == torch.bool \
            and value.dim() == 1:
        return value.detach().cpu().contiguous().numpy().view(np.uint8)
    return None


class MaskSpec(_Frozen):
    """Which tokens are scored. Inactive tokens get logp exactly 0."""

    __slots__ = ()

    def __init__(self, num_tokens, active_mask, ignore_index=-100):
        num_tokens = check_int(num_tokens, "num_tokens", "positive")
        ignore_index = check_int(ignore_index, "ignore_index")
        fast = _bool_bytes(active_mask)
        if fast is not None and fast.shape == (num_tokens,):
            self._init(_detlogp.mask_spec_from_bytes(fast, ignore_index))
            return
        mask = _mask_elements(active_mask)
        self._init(_detlogp.MaskSpec(num_tokens=num_tokens, active_mask=mask,
                                     ignore_index=ignore_index))

    @classmethod
    def all_active(cls, num_tokens, ignore_index=-100):
        """Every one of ``num_tokens`` tokens active."""
        n = check_int(num_tokens, "num_tokens", "positive")
        return cls(n, [True] * n if n > 0 else [], ignore_index)

    @classmethod
    def _from_cpp(cls, cpp):
        self = object.__new__(cls)
        self._init(cpp)
        return self

    num_tokens = property(lambda self: self._cpp.num_tokens)
    ignore_index = property(lambda self: self._cpp.ignore_index)
    active_token_count = property(lambda self: self._cpp.active_token_count)
    active_mask_sha256 = property(lambda self: self._cpp.active_mask_sha256)

    @property
    def active_mask(self):
        return tuple(self._cpp.active_mask)

    def _kwargs(self):
        return dict(num_tokens=self.num_tokens, active_mask=self.active_mask,
                    ignore_index=self.ignore_index)

    def __repr__(self):
        return (f"MaskSpec(num_tokens={self.num_tokens}, active_token_count="
                f"{self.active_token_count}, ignore_index={self.ignore_index}, "
                f"active_mask_sha256={self.active_mask_sha256!r})")


# ---------------------------------------------------------------------------------------------

_REDUCTION_FIELDS = (
    ("merge", Merge, Merge.max_sumexp),
    ("merge_axis", MergeAxis, MergeAxis.tp_vocab),
    ("acc_dtype", DType, DType.fp32),
    ("order", ReductionOrder, ReductionOrder.canonical_tile_tree),
    ("transport", Transport, Transport.all_gather),
    ("downcast_at", DowncastPoint, DowncastPoint.final_write),
    ("engine", Engine, Engine.in_op_reference),
    ("determinism_scope", DeterminismScope, DeterminismScope.cross_tp_bitwise),
)


class ReductionSpec(_Frozen):
    """How the vocab-parallel partials merge. Defaults shown; strings accepted.

    detlogp's default ``order`` is ``canonical_tile_tree`` (the fixed-tile-count
    ``global_vocab_shard_index`` stays legal; backends declare which orders they implement).
    """

    __slots__ = ()

    def __init__(self, merge=Merge.max_sumexp, merge_axis=MergeAxis.tp_vocab,
                 acc_dtype=DType.fp32, order=ReductionOrder.canonical_tile_tree,
                 transport=Transport.all_gather, downcast_at=DowncastPoint.final_write,
                 engine=Engine.in_op_reference,
                 determinism_scope=DeterminismScope.cross_tp_bitwise):
        given = dict(merge=merge, merge_axis=merge_axis, acc_dtype=acc_dtype, order=order,
                     transport=transport, downcast_at=downcast_at, engine=engine,
                     determinism_scope=determinism_scope)
        values = {name: coerce_enum(cls, given[name], name).value
                  for name, cls, _ in _REDUCTION_FIELDS}
        self._init(_detlogp.ReductionSpec(**values))

    @classmethod
    def _from_cpp(cls, cpp):
        self = object.__new__(cls)
        self._init(cpp)
        return self

    merge = property(lambda self: Merge(self._cpp.merge))
    merge_axis = property(lambda self: MergeAxis(self._cpp.merge_axis))
    acc_dtype = property(lambda self: DType(self._cpp.acc_dtype))
    order = property(lambda self: ReductionOrder(self._cpp.order))
    transport = property(lambda self: Transport(self._cpp.transport))
    downcast_at = property(lambda self: DowncastPoint(self._cpp.downcast_at))
    engine = property(lambda self: Engine(self._cpp.engine))
    determinism_scope = property(lambda self: DeterminismScope(self._cpp.determinism_scope))
    cp_is_merge_axis = property(lambda self: False)

    def _kwargs(self):
        return {name: getattr(self, name) for name, _, _ in _REDUCTION_FIELDS}


class LogprobOutputSpec(_Frozen):
    """fp32 outputs, replicated on every TP rank."""

    __slots__ = ()

    def __init__(self, selected_logp_dtype=DType.fp32, lse_dtype=DType.fp32,
                 tp_placement=TPPlacement.replicated):
        self._init(_detlogp.OutputSpec(
            selected_logp_dtype=coerce_enum(DType, selected_logp_dtype,
                                            "selected_logp_dtype").value,
            lse_dtype=coerce_enum(DType, lse_dtype, "lse_dtype").value,
            tp_placement=coerce_enum(TPPlacement, tp_placement, "tp_placement").value))

    @classmethod
    def _from_cpp(cls, cpp):
        self = object.__new__(cls)
        self._init(cpp)
        return self

    selected_logp_dtype = property(lambda self: DType(self._cpp.selected_logp_dtype))
    lse_dtype = property(lambda self: DType(self._cpp.lse_dtype))
    tp_placement = property(lambda self: TPPlacement(self._cpp.tp_placement))

    def _kwargs(self):
        return dict(selected_logp_dtype=self.selected_logp_dtype, lse_dtype=self.lse_dtype,
                    tp_placement=self.tp_placement)


OutputSpec = LogprobOutputSpec


# ---------------------------------------------------------------------------------------------


def _temperature(value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise LogprobContractError(f"temperature must be a finite number > 0; got {value!r}")
    return float(value)


def _softcap(value):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise LogprobContractError(
            f"softcap must be None or a finite number > 0; got {value!r}")
    return float(value)


class LogprobContract(_Frozen):
    """One selected-token logprob request, with detlogp's tile width and temperature.

    ``reduction=None`` / ``output=None`` mean the defaults. ``tile_width`` (W) or the tile count
    ``num_vocab_tiles`` (W = padded / n) give the vocab tile width; neither means W = 128.
    Scores are computed on ``logits / temperature`` (in fp32: the temperature is rounded to
    float32 once, and ``.temperature`` returns that value). ``softcap`` (None: no cap; else
    finite and > 0, rounded to float32 like the temperature) caps the logits first:
    ``softcap * tanh(logits / softcap) / temperature``.
    """

    __slots__ = ("_mask", "_sharding", "_reduction", "_output", "_num_vocab_tiles",
                 "_tile_width_arg")

    def __init__(self, role, dtype, mask, sharding, reduction=None, output=None,
                 export_lse=True, tile_width=None, num_vocab_tiles=None, temperature=1.0,
                 softcap=None):
        role = coerce_enum(Role, role, "role")
        dtype = coerce_enum(DType, dtype, "dtype")
        if not isinstance(mask, MaskSpec):
            raise LogprobContractError("mask must be a MaskSpec")
        if not isinstance(sharding, ShardingSpec):
            raise LogprobContractError("sharding must be a ShardingSpec")
        if reduction is None:
            reduction = ReductionSpec()
        if not isinstance(reduction, ReductionSpec):
            raise LogprobContractError("reduction must be a ReductionSpec")
        if output is None:
            output = LogprobOutputSpec()
        if not isinstance(output, LogprobOutputSpec):
            raise LogprobContractError("output must be a LogprobOutputSpec")
        if export_lse is not True:
            raise LogprobContractError(
                "export_lse must be True: the vocab-parallel contract always exports the "
                "vocab-domain LSE (for drift checks)")
        tile_width = check_optional_int(tile_width, "tile_width", "positive")
        num_vocab_tiles = check_optional_int(num_vocab_tiles, "num_vocab_tiles", "positive")
        temperature = _temperature(temperature)
        softcap = _softcap(softcap)
        cpp = _detlogp.LogprobContract(
            role=role.value, dtype=dtype.value, mask=mask._cpp, sharding=sharding._cpp,
            reduction=reduction._cpp, output=output._cpp, export_lse=True,
            temperature=temperature, tile_width=tile_width, num_vocab_tiles=num_vocab_tiles,
            softcap=softcap)
        self._init(cpp, _mask=mask, _sharding=sharding, _reduction=reduction, _output=output,
                   _num_vocab_tiles=num_vocab_tiles, _tile_width_arg=tile_width)

    role = property(lambda self: Role(self._cpp.role))
    dtype = property(lambda self: DType(self._cpp.dtype))
    mask = property(lambda self: self._mask)
    sharding = property(lambda self: self._sharding)
    reduction = property(lambda self: self._reduction)
    output = property(lambda self: self._output)
    export_lse = property(lambda self: True)
    temperature = property(lambda self: self._cpp.temperature)
    #: The logit softcap (float32 value), or None.
    softcap = property(lambda self: self._cpp.softcap)
    #: The resolved vocab tile width W.
    tile_width = property(lambda self: self._cpp.tile_width)
    #: As given (None unless the tile count form was used).
    num_vocab_tiles = property(lambda self: self._num_vocab_tiles)
    numerics_version = property(lambda self: self._cpp.numerics_version)

    def to_dict(self):
        """Requested-contract provenance: the C++ to_json(), parsed (JSON-compatible)."""
        return json.loads(self._cpp.to_json())

    def to_json(self):
        """Compact JSON with sorted keys (byte-identical to the C++ to_json())."""
        return self._cpp.to_json()

    def _sharing_mask(self):
        """This contract with its ``mask`` a view of the C++ contract's own mask, so that the
        mask is held once (the MaskSpec it was built from may be dropped)."""
        object.__setattr__(self, "_mask", MaskSpec._from_cpp(self._cpp.mask))
        return self

    def cross_rank_fingerprint(self):
        """Hex SHA-256 of the canonical JSON without the rank-local sharding keys."""
        return self._cpp.cross_rank_fingerprint()

    def check_tile_alignment(self):
        """Raises LogprobContractError when a shard bound is not a multiple of tile_width."""
        self._cpp.check_tile_alignment()

    def tile_alignment_problem(self):
        """The message check_tile_alignment() would raise, or None."""
        return self._cpp.tile_alignment_problem()

    def replace(self, **changes):
        """A copy with some fields changed, validated again. Every constructor field may be
        given, None included (meaning what it means to the constructor). ``tile_width`` and
        ``num_vocab_tiles`` are two ways to say one thing: changing one drops the other."""
        fields = dict(role=self.role, dtype=self.dtype, mask=self.mask, sharding=self.sharding,
                      reduction=self.reduction, output=self.output, export_lse=True,
                      tile_width=self._tile_width_arg, num_vocab_tiles=self._num_vocab_tiles,
                      temperature=self.temperature, softcap=self.softcap)
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"LogprobContract has no field(s) {sorted(unknown)}")
        if "num_vocab_tiles" in changes and "tile_width" not in changes:
            fields["tile_width"] = None
        if "tile_width" in changes and "num_vocab_tiles" not in changes:
            fields["num_vocab_tiles"] = None
        fields.update(changes)
        return LogprobContract(**fields)

    def _kwargs(self):
        kwargs = dict(role=self.role, dtype=self.dtype, mask=self.mask, sharding=self.sharding,
                      reduction=self.reduction, output=self.output, export_lse=True)
        if self._num_vocab_tiles is not None:
            kwargs["num_vocab_tiles"] = self._num_vocab_tiles
        if self._tile_width_arg is not None or self._num_vocab_tiles is None:
            kwargs["tile_width"] = self.tile_width
        kwargs["temperature"] = self.temperature
        if self.softcap is not None:
            kwargs["softcap"] = self.softcap
        return kwargs


# ---------------------------------------------------------------------------------------------


def _enum_set(cls, values, field, message):
    if values is None or isinstance(values, (str, bytes)):
        if isinstance(values, str):
            values = [values]  # a single value string
        else:
            raise LogprobContractError(message)
    try:
        items = list(values)
    except TypeError:
        raise LogprobContractError(message) from None
    return frozenset(coerce_enum(cls, v, field) for v in items)


def _size_list(values, field):
    if values is None:
        return None
    if isinstance(values, (str, bytes)):
        raise LogprobContractError(f"{field} must be None or an iterable of positive integers")
    try:
        items = list(values)
    except TypeError:
        raise LogprobContractError(
            f"{field} must be None or an iterable of positive integers") from None
    if not items:
        raise LogprobContractError(f"{field} must not be empty; use None for unrestricted")
    return tuple(check_int(v, f"{field}[{i}]", "positive") for i, v in enumerate(items))


class LogprobBackendCapability(_Frozen):
    """What a backend can serve (roles, dtypes, layouts, plus tile widths, reduction orders and
    temperature support). ``incompatibilities(contract)`` lists every reason it cannot."""

    __slots__ = ("_fields",)

    def __init__(self, backend_id, roles, dtypes, tp_world_sizes=None, cp_world_sizes=None,
                 supports_vocab_padding=False, mask_modes=(), exports_vocab_lse=False,
                 determinism_scopes=(), implementation_kind=ImplementationKind.production,
                 tile_widths=None, supports_temperature=False,
                 reduction_orders=(ReductionOrder.canonical_tile_tree,), supports_softcap=False,
                 supports_kept_sets=False, supports_unaligned_bounds=False):
        if not isinstance(backend_id, str):
            raise LogprobContractError("backend_id must be a non-empty string")
        msg = "roles and dtypes must be iterables of enum values"
        roles = _enum_set(Role, roles, "roles", msg)
        dtypes = _enum_set(DType, dtypes, "dtypes", msg)
        tp_world_sizes = _size_list(tp_world_sizes, "tp_world_sizes")
        cp_world_sizes = _size_list(cp_world_sizes, "cp_world_sizes")
        msg = "mask_modes and determinism_scopes must be iterables of enum values"
        mask_modes = _enum_set(MaskMode, mask_modes, "mask_modes", msg)
        determinism_scopes = _enum_set(DeterminismScope, determinism_scopes,
                                       "determinism_scopes", msg)
        check_bool(supports_vocab_padding, "supports_vocab_padding")
        check_bool(exports_vocab_lse, "exports_vocab_lse")
        implementation_kind = coerce_enum(ImplementationKind, implementation_kind,
                                          "implementation_kind")
        tile_widths = _size_list(tile_widths, "tile_widths")
        check_bool(supports_temperature, "supports_temperature")
        check_bool(supports_softcap, "supports_softcap")
        check_bool(supports_kept_sets, "supports_kept_sets")
        check_bool(supports_unaligned_bounds, "supports_unaligned_bounds")
        reduction_orders = _enum_set(ReductionOrder, reduction_orders, "reduction_orders",
                                     "reduction_orders must be an iterable of enum values")
        vals = lambda s: sorted(m.value for m in s)  # noqa: E731
        cpp = _detlogp.BackendCapability(
            backend_id=backend_id, roles=vals(roles), dtypes=vals(dtypes),
            tp_world_sizes=None if tp_world_sizes is None else list(tp_world_sizes),
            cp_world_sizes=None if cp_world_sizes is None else list(cp_world_sizes),
            supports_vocab_padding=supports_vocab_padding, mask_modes=vals(mask_modes),
            exports_vocab_lse=exports_vocab_lse, determinism_scopes=vals(determinism_scopes),
            implementation_kind=implementation_kind.value,
            tile_widths=None if tile_widths is None else list(tile_widths),
            supports_temperature=supports_temperature,
            reduction_orders=vals(reduction_orders), supports_softcap=supports_softcap,
            supports_kept_sets=supports_kept_sets,
            supports_unaligned_bounds=supports_unaligned_bounds)
        self._init(cpp, _fields=json.loads(cpp.to_json()))

    @classmethod
    def _from_cpp(cls, cpp):
        self = object.__new__(cls)
        self._init(cpp, _fields=json.loads(cpp.to_json()))
        return self

    def _set_of(cls, key):  # noqa: N805 - property factory
        return property(lambda self: frozenset(cls(v) for v in self._fields[key]))

    def _tuple_or_none(key):  # noqa: N805 - property factory
        return property(lambda self: None if self._fields[key] is None
                        else tuple(self._fields[key]))

    backend_id = property(lambda self: self._fields["backend_id"])
    roles = _set_of(Role, "roles")
    dtypes = _set_of(DType, "dtypes")
    tp_world_sizes = _tuple_or_none("tp_world_sizes")
    cp_world_sizes = _tuple_or_none("cp_world_sizes")
    supports_vocab_padding = property(lambda self: self._fields["supports_vocab_padding"])
    mask_modes = _set_of(MaskMode, "mask_modes")
    exports_vocab_lse = property(lambda self: self._fields["exports_vocab_lse"])
    determinism_scopes = _set_of(DeterminismScope, "determinism_scopes")
    implementation_kind = property(
        lambda self: ImplementationKind(self._fields["implementation_kind"]))
    tile_widths = _tuple_or_none("tile_widths")
    supports_temperature = property(lambda self: self._fields["supports_temperature"])
    supports_softcap = property(lambda self: self._fields["supports_softcap"])
    supports_kept_sets = property(lambda self: self._fields["supports_kept_sets"])
    supports_unaligned_bounds = property(lambda self: self._fields["supports_unaligned_bounds"])
    reduction_orders = _set_of(ReductionOrder, "reduction_orders")
    del _set_of, _tuple_or_none

    def incompatibilities(self, contract):
        """Every reason this backend cannot serve ``contract``, in order (empty: it can)."""
        if not isinstance(contract, LogprobContract):
            raise LogprobContractError("contract must be a LogprobContract")
        return tuple(self._cpp.incompatibilities(contract._cpp))

    def supports(self, contract):
        return not self.incompatibilities(contract)

    def to_dict(self):
        return json.loads(self._cpp.to_json())

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._fields == other._fields

    def __hash__(self):
        return hash(self._cpp.to_json())

    def _kwargs(self):
        f = self._fields
        return dict(backend_id=f["backend_id"], roles=self.roles, dtypes=self.dtypes,
                    tp_world_sizes=self.tp_world_sizes, cp_world_sizes=self.cp_world_sizes,
                    supports_vocab_padding=f["supports_vocab_padding"],
                    mask_modes=self.mask_modes, exports_vocab_lse=f["exports_vocab_lse"],
                    determinism_scopes=self.determinism_scopes,
                    implementation_kind=self.implementation_kind,
                    tile_widths=self.tile_widths,
                    supports_temperature=f["supports_temperature"],
                    reduction_orders=self.reduction_orders,
                    supports_softcap=f["supports_softcap"],
                    supports_kept_sets=f["supports_kept_sets"],
                    supports_unaligned_bounds=f["supports_unaligned_bounds"])


# ---------------------------------------------------------------------------------------------
# Shard-bound helpers (the C++ ones).


def even_bounds(padded_vocab_size, tp_world_size):
    """Even bounds: shard = padded // tp, the last rank takes the remainder."""
    return tuple(_detlogp.even_bounds(check_int(padded_vocab_size, "padded_vocab_size"),
                                      check_int(tp_world_size, "tp_world_size")))


def even_tile_aligned_bounds(padded_vocab_size, tp_world_size, tile_width=128):
    """Whole tiles of ``tile_width``; the first (tiles mod tp) ranks take one extra tile."""
    return tuple(_detlogp.even_tile_aligned_bounds(
        check_int(padded_vocab_size, "padded_vocab_size"),
        check_int(tp_world_size, "tp_world_size"), check_int(tile_width, "tile_width")))


def megatron_padded_vocab(real_vocab_size, tp_world_size, multiple=128):
    """Megatron's padded vocabulary: real rounded up to a multiple of multiple * tp."""
    return _detlogp.megatron_padded_vocab(check_int(real_vocab_size, "real_vocab_size"),
                                          check_int(tp_world_size, "tp_world_size"),
                                          check_int(multiple, "multiple"))


def megatron_bounds(real_vocab_size, tp_world_size, multiple=128):
    """(padded_vocab_size, vocab_shard_bounds) of Megatron's layout."""
    padded, bounds = _detlogp.megatron_bounds(check_int(real_vocab_size, "real_vocab_size"),
                                              check_int(tp_world_size, "tp_world_size"),
                                              check_int(multiple, "multiple"))
    return padded, tuple(bounds)
