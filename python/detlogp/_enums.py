"""String enums of the logprob contract (docs/contract.md, "Enums").

Every enum is a ``str`` subclass whose members compare equal to their lowercase value strings.
Contract fields accept a member or its exact (case-sensitive) value string.
"""

import enum

from ._detlogp import LogprobContractError


class _StrEnum(str, enum.Enum):
    def __str__(self):
        return self.value

    def __repr__(self):
        return f"{type(self).__name__}.{self.name}"


class Role(_StrEnum):
    train = "train"
    infer = "infer"


class DType(_StrEnum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class Merge(_StrEnum):
    max_sumexp = "max_sumexp"


class MergeAxis(_StrEnum):
    tp_vocab = "tp_vocab"


class ReductionOrder(_StrEnum):
    global_vocab_shard_index = "global_vocab_shard_index"
    canonical_tile_tree = "canonical_tile_tree"


class Transport(_StrEnum):
    all_gather = "all_gather"


class DowncastPoint(_StrEnum):
    final_write = "final_write"


class Engine(_StrEnum):
    in_op_reference = "in_op_reference"


class TPPlacement(_StrEnum):
    replicated = "replicated"


class DeterminismScope(_StrEnum):
    fixed_topology = "fixed_topology"
    cross_tp_bitwise = "cross_tp_bitwise"


class MaskMode(_StrEnum):
    explicit_active_mask = "explicit_active_mask"
    ignore_index = "ignore_index"


class ImplementationKind(_StrEnum):
    production = "production"
    reference = "reference"


ALL_ENUMS = (Role, DType, Merge, MergeAxis, ReductionOrder, Transport, DowncastPoint, Engine,
             TPPlacement, DeterminismScope, MaskMode, ImplementationKind)

RESERVED_DISPATCH_POLICIES = frozenset({"auto", "production", "reference", "deterministic"})
IMPLEMENTATION_KINDS = frozenset({"production", "reference"})


def coerce_enum(cls, value, field):
    """``value`` as a member of ``cls``: a member, or a member's exact value string.

    Otherwise LogprobContractError("<field> must be one of: <v1>, <v2>; got <repr>").
    """
    if isinstance(value, cls):
        return value
    if type(value) is str:  # a member of another enum is not a value string of this one
        for member in cls:
            if member.value == value:
                return member
    allowed = ", ".join(m.value for m in cls)
    raise LogprobContractError(f"{field} must be one of: {allowed}; got {value!r}")
