"""Backward re-reads the buffers forward read (the logits; the fused lm_head's hidden states and
weight) through the addresses forward saw. Autograd keeps the tensors alive and refuses a
backward after an in-place change, but a storage can lose its memory without either: FSDP and
offloading free it with ``storage().resize_(0)``, which does not bump the version counter, and
may allocate it again elsewhere. Reading the old address then is a use after free (a crash, or
garbage gradients), so each buffer's storage is stamped at forward (address and size) and
checked before backward reads it: a storage that no longer holds the same memory raises.
"""

import numpy as np

from ._detlogp import LogprobContractError


def _storage(x):
    """The untyped storage: ``untyped_storage()`` (torch >= 2.0) or ``_storage()`` (1.13, where
    the public ``storage()`` builds a typed wrapper at several microseconds a call)."""
    for name in ("untyped_storage", "_storage"):
        get = getattr(x, name, None)
        if get is not None:
            return get()
    return x.storage()


def stamp(x):
    """(address, bytes) of the storage behind torch tensor ``x``; None for a NumPy array (it
    keeps its memory while referenced)."""
    if isinstance(x, np.ndarray):
        return None
    s = _storage(x)
    return s.data_ptr(), s.nbytes()


def check_stamp(x, saved, name):
    """Raises LogprobContractError where ``x``'s storage no longer holds the memory that forward
    read (``saved``: its ``stamp`` then)."""
    if saved is None:
        return
    s = _storage(x)
    now = (s.data_ptr(), s.nbytes())
    if now != saved:
        raise LogprobContractError(
            f"the storage of {name} was freed or moved after forward (forward read {saved[1]} "
            f"bytes at {saved[0]:#x}; the storage now holds {now[1]} bytes at {now[0]:#x}, as "
            "after storage().resize_(0) by FSDP or offloading). Backward reads that memory "
            f"again: keep {name} allocated in place until backward is done (free or reshard it "
            "after backward), or run forward again")
