"""String enums of the logprob contract (docs/contract.md, "Enums"), built from the C++
library's value strings.

Every enum is a ``str`` subclass whose members compare equal to their lowercase value strings.
Contract fields accept a member or its exact (case-sensitive) value string.
"""

import enum

from . import _detlogp
from ._detlogp import LogprobContractError


class _StrEnum(str, enum.Enum):
    def __str__(self):
        return self.value

    def __repr__(self):
        return f"{type(self).__name__}.{self.name}"


def _contract_enum(name):
    """The enum ``name`` with the C++ library's value strings (detlogp::enum_values), in its
    order: the library is the one place the values are written."""
    values = _detlogp.enum_values(name)
    return _StrEnum(name, [(v, v) for v in values], module=__name__, qualname=name)


# Every contract enum, in the library's order (it fails here if the library adds one).
ALL_ENUMS = tuple(_contract_enum(name) for name in _detlogp.ENUM_NAMES)
(Role, DType, Merge, MergeAxis, ReductionOrder, Transport, DowncastPoint, Engine, TPPlacement,
 DeterminismScope, MaskMode, ImplementationKind) = ALL_ENUMS

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
