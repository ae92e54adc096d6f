"""Names for the detlogp objects a custom op's argument refers to (detlogp/_ops.py): an op's
schema holds tensors, numbers, bools and strings, so a Communicator, a ``CallCache`` or a
contract crosses as a name, and the op's implementation finds the object again by it. A name
lives as long as its object (no reference is kept)."""

import weakref

from ._detlogp import LogprobContractError

__all__ = ["name_of", "named"]

_NAMED = weakref.WeakValueDictionary()  # name -> object


def name_of(obj, kind):
    """The name of ``obj`` (``kind``: "comm", "cache", "contract"): the same for the same
    object while it lives."""
    name = f"detlogp-{kind}:{id(obj)}"
    if _NAMED.get(name) is not obj:
        _NAMED[name] = obj
    return name


def named(name):
    """The object of a name made by ``name_of``."""
    obj = _NAMED.get(name)
    if obj is None:
        raise LogprobContractError(f"no detlogp object is named {name!r} any more")
    return obj
