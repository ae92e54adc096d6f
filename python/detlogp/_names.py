"""Names for the detlogp objects a custom op's argument refers to (detlogp/_ops.py): an op's
schema holds tensors, numbers, bools and strings, so a Communicator, a ``CallCache`` or a
contract crosses as a name, and the op's implementation finds the object again by it. A name
made by ``name_of`` lives as long as its object (no reference is kept); one made by ``lent``
(for objects that take no weak reference) for the duration of a ``with`` block."""

import contextlib
import threading
import weakref

from ._detlogp import LogprobContractError

__all__ = ["name_of", "named", "lent"]

_NAMED = weakref.WeakValueDictionary()  # name -> object
_LENT = {}  # name -> [object, how many blocks lend it]
_LOCK = threading.Lock()


def name_of(obj, kind):
    """The name of ``obj`` (``kind``: "comm", "cache", "contract"): the same for the same
    object while it lives."""
    name = f"detlogp-{kind}:{id(obj)}"
    if _NAMED.get(name) is not obj:
        _NAMED[name] = obj
    return name


@contextlib.contextmanager
def lent(obj, kind):
    """The name of ``obj`` inside the block (the op call it is passed to)."""
    name = f"detlogp-{kind}:{id(obj)}"
    with _LOCK:
        _LENT.setdefault(name, [obj, 0])[1] += 1
    try:
        yield name
    finally:
        with _LOCK:
            entry = _LENT[name]
            entry[1] -= 1
            if entry[1] == 0:
                del _LENT[name]


def named(name):
    """The object of a name made by ``name_of`` or ``lent``."""
    obj = _NAMED.get(name)
    if obj is None:
        obj = _LENT.get(name, (None,))[0]
    if obj is None:
        raise LogprobContractError(f"no detlogp object is named {name!r} any more")
    return obj
