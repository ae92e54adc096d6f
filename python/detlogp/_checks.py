"""Python-side type checks (docs/python.md, "Python-only checks").

Only what the C++ type system would otherwise absorb is checked here: bools are not integers,
``1`` is not a bool, a float is not an integer, an integer must fit in int64. Value rules
(positivity, ordering, coverage, ...) are the C++ library's, with its messages.
"""

import operator

import numpy as np

from ._detlogp import LogprobContractError

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_KIND_TEXT = {
    "positive": "a positive integer",
    "non-negative": "a non-negative integer",
    "int": "an integer",
}


def is_int(value):
    """An integer that is not a bool: int, numpy integer, or anything with __index__."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, np.integer):
        return True
    return hasattr(type(value), "__index__") and not isinstance(value, (float, complex, str))


def check_int(value, field, kind="int"):
    """``value`` as a Python int; LogprobContractError("<field> must be <kind>; got X").

    Only the type is checked here (and the int64 range); the sign rules are the C++ layer's,
    which uses the same message.
    """
    if not is_int(value):
        raise LogprobContractError(f"{field} must be {_KIND_TEXT[kind]}; got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise LogprobContractError(f"{field} must be {_KIND_TEXT[kind]}; got {value!r}") from None
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise LogprobContractError(f"{field}={v} does not fit in a 64-bit integer")
    return v


def check_optional_int(value, field, kind="positive"):
    return None if value is None else check_int(value, field, kind)


def check_bool(value, field):
    """A real Python bool: ``deterministic=1`` -> "deterministic must be a bool; got 1"."""
    if type(value) is not bool:
        raise LogprobContractError(f"{field} must be a bool; got {value!r}")
    return value


def is_bool(value):
    return type(value) is bool or isinstance(value, np.bool_)
