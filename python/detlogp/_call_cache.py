"""What the functional API keeps between calls, so a steady training loop builds nothing twice.

- Contracts, keyed by everything that goes into them (shape, dtype, sharding, temperature,
  tile width, scope, ignore_index and a 128-bit digest of the mask): a micro-batch with the
  mask of an earlier one reuses its contract; an all-active mask needs no digest. A kept
  contract holds its mask once (one bit per token, in C++), and the masks kept stay under
  ``contract_bytes`` in all.
- Dispatch results, keyed by the contract minus its mask (and whether every token is active,
  the one mask property a capability looks at).
- Communicators, one per process group.
- Gradient buffers: backward writes the gradient of the logits (tokens x vocab shard, hundreds
  of MB) into a buffer; a fresh one costs a page fault per 4 KiB page on first touch (the
  kernel zeroes every page), about as much as the backward itself. The pool hands out a
  buffer again once nothing refers to it any more (no tensor, view or autograd node uses its
  memory: its owner's reference count says so), which is how the gradient of the previous
  micro-batch comes back once the trainer has consumed it.

All of it lives in a ``CallCache`` (thread-safe, bounded); the functional API uses one shared
instance unless given another. ``clear()`` drops everything (e.g. after registering backends).
"""

import collections
import hashlib
import sys
import threading
import weakref

import numpy as np

from . import _detlogp
from ._buffers import torch_module
from ._checks import check_int
from ._comm import Communicator, TorchDistributedComm
from ._contract import LogprobContract, MaskSpec
from ._detlogp import LogprobContractError
from ._names import name_of


def mask_digest(active_bytes):
    """The cache key of a mask: a 128-bit BLAKE2b digest of its bits (one byte per token in,
    packed to one bit per token first: 16 bytes kept whatever the token count)."""
    return hashlib.blake2b(np.packbits(active_bytes).data, digest_size=16).digest()


class _Lru:
    """At most ``capacity`` items whose weights sum to at most ``max_weight`` (the newest
    item is kept even when it alone weighs more)."""

    def __init__(self, capacity, max_weight=None):
        self.capacity = capacity
        self.max_weight = max_weight
        self.weight = 0
        self.items = collections.OrderedDict()  # key -> (value, weight)

    def get(self, key):
        found = self.items.get(key)
        if found is None:
            return None
        self.items.move_to_end(key)
        return found[0]

    def put(self, key, value, weight=0):
        old = self.items.pop(key, None)
        if old is not None:
            self.weight -= old[1]
        self.items[key] = (value, weight)
        self.weight += weight
        while len(self.items) > self.capacity or (
                self.max_weight is not None and self.weight > self.max_weight
                and len(self.items) > 1):
            self.weight -= self.items.popitem(last=False)[1][1]


class CallCache:
    """Contracts, dispatch results, communicators and gradient buffers of the functional API.

    ``contracts``: how many contracts to keep (LRU); ``contract_bytes``: how many bytes of
    masks (one bit per token) the kept contracts may hold in all, the most recent one
    excepted; ``grad_buffers``: how many gradient buffers to keep for reuse (0 disables the
    pool); ``min_pooled_bytes``: smaller gradients are allocated fresh (they cost little).
    """

    def __init__(self, contracts=256, grad_buffers=2, min_pooled_bytes=1 << 20,
                 contract_bytes=64 << 20):
        for field, value in (("contracts", contracts), ("grad_buffers", grad_buffers),
                             ("min_pooled_bytes", min_pooled_bytes),
                             ("contract_bytes", contract_bytes)):
            if check_int(value, field, "non-negative") < 0:
                raise LogprobContractError(
                    f"{field} must be a non-negative integer (0: keep none); got {value}")
        self._lock = threading.Lock()
        self._contracts = _Lru(contracts, contract_bytes)
        self._ops = _Lru(64)
        self._comms = weakref.WeakKeyDictionary()
        self._comm_by_id = {}
        self._grad_capacity = grad_buffers
        self._min_pooled = min_pooled_bytes
        self._grads = []  # owners (NumPy byte arrays) of pooled gradient buffers
        self.stats = collections.Counter()  # contract_hits/misses, grad_reuses/allocs
        self.op_name = name_of(self, "cache")  # how a custom op's argument names it (_ops.py)

    def clear(self):
        with self._lock:
            self._contracts = _Lru(self._contracts.capacity, self._contracts.max_weight)
            self._ops = _Lru(64)
            self._comms = weakref.WeakKeyDictionary()
            self._comm_by_id = {}
            self._grads = []
            self.stats.clear()

    # --- communicators -------------------------------------------------------------------
    def communicator(self, group):
        """The detlogp Communicator of a process group (None: a single rank)."""
        if group is None or isinstance(group, Communicator):
            return group
        with self._lock:
            try:
                comm = self._comms.get(group)
            except TypeError:  # not weak-referenceable: keep it by identity
                comm = self._comm_by_id.get(id(group), (None, None))[1]
        if comm is None:
            comm = TorchDistributedComm(group)
            with self._lock:
                try:
                    self._comms[group] = comm
                except TypeError:
                    self._comm_by_id[id(group)] = (group, comm)
        return comm

    # --- contracts and dispatch ----------------------------------------------------------
    def contract_mask_bytes(self):
        """Bytes of masks the kept contracts hold (one bit per token each)."""
        with self._lock:
            return self._contracts.weight

    def contract(self, key, active, ignore_index, make_sharding, dtype, temperature, tile_width,
                 reduction, softcap=None, role="train"):
        """The contract of ``key`` (built on a miss from the uint8 ``active`` mask and
        ``make_sharding()``; ``role``: "train", or "infer" for the sampler). The key holds no mask
        (a digest of it), and what is kept is the contract alone, holding its mask once."""
        with self._lock:
            found = self._contracts.get(key)
            self.stats["contract_hits" if found is not None else "contract_misses"] += 1
        if found is not None:
            return found
        mask = MaskSpec._from_cpp(_detlogp.mask_spec_from_bytes(active, ignore_index))
        contract = LogprobContract(role=role, dtype=dtype, mask=mask, sharding=make_sharding(),
                                   reduction=reduction, tile_width=tile_width,
                                   temperature=temperature, softcap=softcap)
        contract = contract._sharing_mask()
        with self._lock:
            self._contracts.put(key, contract, (len(active) + 7) // 8)
        return contract

    def op(self, key, dispatch):
        """The dispatch result of ``key``: ``dispatch()`` on a miss."""
        with self._lock:
            found = self._ops.get(key)
        if found is None:
            found = dispatch()
            with self._lock:
                self._ops.put(key, found)
        return found

    # --- gradient buffers ----------------------------------------------------------------
    def grad_buffer(self, rows, cols, dtype, device):
        """An uninitialized contiguous [rows, cols] tensor for backward to fill."""
        torch = torch_module()  # asked for torch gradients only: torch is there
        nbytes = rows * cols * torch.empty((), dtype=dtype).element_size()
        if device.type != "cpu" or self._grad_capacity == 0 or nbytes < self._min_pooled:
            return torch.empty((rows, cols), dtype=dtype, device=device)
        with self._lock:
            for i in range(len(self._grads)):
                # References when free: the pool's list and getrefcount's argument (no local
                # name may hold it during the count). Any tensor over this memory holds one more.
                if self._grads[i].nbytes == nbytes and sys.getrefcount(self._grads[i]) == 2:
                    owner = self._grads.pop(i)
                    self._grads.append(owner)
                    self.stats["grad_reuses"] += 1
                    return torch.frombuffer(owner, dtype=dtype).view(rows, cols)
            owner = np.empty(nbytes, dtype=np.uint8)
            self._grads.append(owner)
            if len(self._grads) > self._grad_capacity:
                self._grads.pop(0)  # forgotten by the pool; freed with its last tensor
            self.stats["grad_allocs"] += 1
        return torch.frombuffer(owner, dtype=dtype).view(rows, cols)


DEFAULT_CACHE = CallCache()
