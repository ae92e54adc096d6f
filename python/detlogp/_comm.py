"""Communicators: a torch.distributed process group as detlogp's transport.

detlogp's C++ operator talks to a ``Communicator`` (include/detlogp/comm.hpp): rank, size,
an all-gather of equal-size byte buffers and a barrier. ``TorchDistributedComm`` is one whose
collectives call back into Python (taking the GIL) and run ``torch.distributed.all_gather``
over uint8 tensors of the given process group (gloo on CPU), and ``dist.barrier(group)``.
Each collective crosses from C++ into Python once: this rank's bytes go in as a bytes object and
every rank's come back as one (they are few: a handful per token), and torch is called twice
(the all-gather, started asynchronously, and its wait).

Where the bytes travel follows the group's backend: a gloo (or MPI) group all-gathers CPU
tensors; any other backend (NCCL, ...) cannot, so the (small: a few bytes per token) buffers
are copied to a tensor on the group's device (the current CUDA device for NCCL), gathered
there and copied back.

No collective waits forever: each one is started with ``async_op=True`` and waited for with
``Work.wait(timeout)``, ``timeout`` seconds (``DEFAULT_COLLECTIVE_TIMEOUT`` unless given, as the
C++ transports). On expiry the waiting rank raises ``RuntimeError`` naming the collective, the
rank, the group and the timeout.

A rank that fails before the collectives (any exception while a call prepares) releases the
peers waiting for it with ``fail_peers``: every entry point routes its failures through it,
so the peers' message is worded the same whatever failed.

Calls on one process group run one at a time in this process (``exclusive``): torch pairs the
collectives of the ranks by their order on the group, so two threads whose calls interleave
their collectives would pair a gather of one call with a gather of the other (a size mismatch
aborts the process inside gloo). Serialising is not enough: nothing tells the ranks which
thread's call came first on each of them, and a call paired with the other thread's call on
a peer would compute with the wrong shard. So a call that finds another call of its group in
flight is refused, and the one in flight fails too: every collective carries one byte saying
whether this rank saw such an overlap, so every rank of the group raises at the same
collective, and a call whose last collective had passed raises on its own rank.
"""

import contextlib
import dataclasses
import datetime
import math
import threading
import weakref

import numpy as np

from . import _detlogp
from ._detlogp import LogprobContractError

Communicator = _detlogp.Communicator
SelfComm = _detlogp.SelfComm

# Seconds a rank waits in one collective for the others: detlogp::kDefaultCollectiveTimeout, the
# default of every transport (docs/comm.md, "Collective timeout").
DEFAULT_COLLECTIVE_TIMEOUT = _detlogp.DEFAULT_COLLECTIVE_TIMEOUT


def _check_timeout(timeout):
    if timeout is None:
        return DEFAULT_COLLECTIVE_TIMEOUT
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise LogprobContractError(
            f"timeout must be a finite number of seconds > 0 (or a datetime.timedelta); got "
            f"{timeout!r}")
    return float(timeout)


def _dist():
    import torch.distributed as dist

    return dist


# Backends whose collectives take CPU tensors.
_CPU_BACKENDS = ("gloo", "mpi")
# The device type of a backend that needs device tensors (anything else: cuda).
_DEVICE_OF_BACKEND = {"nccl": "cuda", "ucc": "cuda", "xccl": "xpu", "hccl": "npu"}


def transport_device(backend):
    """The torch device the collectives of a group with this backend name run on: ``None``
    for CPU tensors (gloo, mpi), else the backend's device (NCCL: the current CUDA device,
    the one the trainer bound with ``torch.cuda.set_device``). A composite backend string
    ("cpu:gloo,cuda:nccl") that includes a CPU backend for CPU tensors uses it."""
    import torch

    name = str(backend).lower()
    parts = [p.split(":")[-1] for p in name.split(",")]
    if any(p in _CPU_BACKENDS for p in parts):
        return None
    device_type = _DEVICE_OF_BACKEND.get(parts[0], "cuda")
    if device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)


class _TransportFailure(RuntimeError):
    """A collective's failure, already worded (cause first) by ``_Callbacks._failure``."""


# How a transport words a peer that went away (gloo: "Connection closed by peer").
_PEER_CLOSED = ("closed by peer", "connection closed", "reset by peer", "broken pipe",
                "connection refused", "end of file")


class _CallGuard:
    """The calls of one process group in this process: one at a time, overlaps remembered.

    ``overlap``: a call arrived while another was in flight (or is waiting now); the call in
    flight sends it with each collective and fails, and so does every peer with it. The
    thread that holds the guard may enter again (a step of its own call, such as releasing
    its peers): that is no overlap."""

    def __init__(self):
        self._cond = threading.Condition()
        self._owner = None  # the thread in a call, or None
        self._depth = 0
        self._waiting = 0
        self.overlap = False

    def enter(self, refuse):
        """Takes the group; False (taking nothing) where another thread's call is in flight
        and ``refuse``."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is not None:
                self.overlap = True
                if refuse:
                    return False
                self._waiting += 1
                while self._owner is not None:
                    self._cond.wait()
                self._waiting -= 1
            else:
                self.overlap = self._waiting > 0
            self._owner, self._depth = me, 1
            return True

    def leave(self):
        """Releases the group (its outermost entry); True where a call of another thread
        overlapped the one that held it."""
        with self._cond:
            seen = self.overlap or self._waiting > 0
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify()
            return seen


_GUARDS_LOCK = threading.Lock()
_GUARD_OF_GROUP = weakref.WeakKeyDictionary()  # process group -> its _CallGuard
_GUARD_OF_GROUP_ID = {}  # id -> (group, guard) for groups that take no weak reference


def _guard_of_group(group):
    with _GUARDS_LOCK:
        try:
            guard = _GUARD_OF_GROUP.get(group)
            if guard is None:
                guard = _GUARD_OF_GROUP[group] = _CallGuard()
        except TypeError:  # not weak-referenceable: kept by identity
            guard = _GUARD_OF_GROUP_ID.setdefault(id(group), (group, _CallGuard()))[1]
        return guard


def _guard_of_comm(comm):
    """The call guard of a TorchDistributedComm's group; None for any other communicator."""
    return getattr(comm, "guard", None)


def _overlap_message(name, rank):
    return (f"two detlogp calls on one process group ({name}) overlapped on rank {rank}: "
            "another thread started a call on the group while one was in flight. The ranks "
            "cannot agree which call pairs with which, so both fail on every rank. Run the "
            "calls on a group one after another, in the same order on every rank, or give "
            "each thread its own group (torch.distributed.new_group)")


@contextlib.contextmanager
def exclusive(comm):
    """Runs the body (one call's whole collective sequence) as the only call of ``comm``'s
    process group in this process. A call that finds another one in flight fails its peers
    and raises ``RuntimeError``; the call in flight raises too (at its next collective on
    every rank, or at the end on this one). Nothing for communicators other than
    ``TorchDistributedComm``."""
    guard = None if comm is None else _guard_of_comm(comm)
    if guard is None:
        yield
        return
    if not guard.enter(refuse=True):
        error = RuntimeError(_overlap_message(comm.name, comm.rank))
        fail_peers(comm, error)
        raise error
    failed = True
    try:
        yield
        failed = False
    finally:
        seen = guard.leave()
    if seen and not failed:
        raise RuntimeError(_overlap_message(comm.name, comm.rank))


def fail_peers(group, error):
    """This rank's call failed before the collectives (a check, or any other exception while
    it prepared): join the preflight the other ranks of its group are waiting in, so that every
    one of them raises "cross-rank preflight failed: rank R failed local validation: <type>:
    <message>" at once instead of waiting for a collective timeout. ``group``: None (nobody to
    release), a detlogp Communicator or a torch.distributed process group. Returns; the caller
    re-raises its own exception. The one place that words the peers' message."""
    if group is None:
        return
    try:
        comm = group if isinstance(group, Communicator) else TorchDistributedComm(group)
    except Exception:  # noqa: BLE001 - no usable group: nobody can be waiting in it
        return
    if comm.size < 2:
        return
    guard = _guard_of_comm(comm)
    if guard is not None:
        guard.enter(refuse=False)  # never interleaved with another call's collectives
    try:
        _detlogp.fail_preflight(comm, f"{type(error).__name__}: {error}")
    except Exception:  # noqa: BLE001 - it always raises; the original error is what counts
        pass
    finally:
        if guard is not None:
            guard.leave()


@contextlib.contextmanager
def peers_fail_on_error(group):
    """The body prepares one call: any exception it raises (a check, or anything else) fails
    the peers of ``group`` first (``fail_peers``) and then propagates. Every entry point
    prepares its calls inside it."""
    try:
        yield
    except Exception as error:  # any exception, not only contract errors: fail the peers too
        fail_peers(group, error)
        raise


def _weak_group(group):
    """A callable returning ``group`` that does not keep it alive (where the group takes a weak
    reference). The communicators of a group are cached per group (weakly keyed), so a strong
    reference from a communicator would keep the group, its sockets and its worker threads alive
    after ``destroy_process_group`` until the interpreter exits, when gloo's threads may be
    stopped in the middle of releasing a tensor (an abort at exit)."""
    try:
        return weakref.ref(group)
    except TypeError:  # not weak-referenceable: kept, as the caches keep it by identity
        return lambda: group


def _alive(group_ref, name):
    group = group_ref()
    if group is None:
        raise RuntimeError(f"{name}: the process group was destroyed; make a new communicator "
                           "(or pass the new group) after init_process_group/new_group")
    return group


@dataclasses.dataclass(eq=False)
class _Callbacks:
    """The Python half of a TorchDistributedComm (kept separate so the C++ object holds only
    two bound methods). ``group_ref``: the process group, weakly (``_weak_group``);
    ``device``: None for CPU tensors, else where the bytes travel; ``guard``: the group's
    _CallGuard."""

    group_ref: object
    rank: int
    size: int
    name: str
    timeout: float
    device: object = None
    guard: object = None
    # The tensors (and Work) of the last collective, released at the start of the next one on
    # this thread: gloo's worker thread drops its own references to them just after the wait
    # returns, and must not be the one that frees Python objects (that takes the GIL on the
    # worker thread, where a garbage collection could run finalizers).
    _last: object = dataclasses.field(default=None, init=False, repr=False)

    def _wait(self, work, collective):
        try:
            work.wait(datetime.timedelta(seconds=self.timeout))
        except RuntimeError as error:
            raise _TransportFailure(self._failure(collective, error)) from error

    def _reported(self, collective, start):
        """``start()`` (a collective, started and waited for); a RuntimeError the transport
        raises while starting it (a peer already gone) is reported like one raised by the wait."""
        try:
            return start()
        except _TransportFailure:
            raise
        except RuntimeError as error:
            raise _TransportFailure(self._failure(collective, error)) from error

    def _failure(self, collective, error):
        """What went wrong, cause first: a timeout (a rank did not arrive), a peer that closed
        the connection (its process ended or failed), or another transport error."""
        text = str(error)
        low = text.lower()
        where = f"{self.name} {collective}"
        rank = f"on rank {self.rank} of {self.size}"
        if "timed out" in low or "timeout" in low:
            return (f"{where} timed out after {self.timeout:g} s {rank}: another rank did not "
                    f"arrive (a rank that fails before forward must still release its peers: "
                    f"see fail_preflight in docs/operator.md) ({text})")
        if any(k in low for k in _PEER_CLOSED):
            return (f"{where} failed {rank}: a peer closed the connection (its process ended or "
                    f"failed; look at the other ranks' errors) ({text})")
        return f"{where} failed {rank}: the transport reported an error ({text})"

    def all_gather(self, send):
        """Every rank's ``send`` bytes, in rank order (one bytes object)."""
        return self._reported("all_gather", lambda: self._all_gather(send))

    def _all_gather(self, send):
        """Gathers one byte more per rank than asked: byte 0 says whether the rank saw two
        calls of the group overlap (then every rank raises here). Zero bytes still synchronise
        (gloo cannot gather empty tensors; the flag is never empty). On a backend without CPU
        collectives the bytes travel through device tensors; a list of views into one tensor
        suits NCCL and gloo alike (gloo of torch 1.13 has no all_gather_into_tensor), so the
        CPU tests exercise that path too."""
        import torch

        dist = _dist()
        n = len(send)
        m = n + 1
        # NumPy for the small bookkeeping: a few microseconds where torch ops cost tens.
        send_np = np.empty(m, dtype=np.uint8)
        send_np[0] = 1 if self.guard is not None and self.guard.overlap else 0
        send_np[1:] = np.frombuffer(send, dtype=np.uint8)
        send_t = torch.from_numpy(send_np)
        if self.device is None:
            recv_np = np.empty(self.size * m, dtype=np.uint8)
            recv = torch.from_numpy(recv_np)
        else:
            send_t = send_t.to(self.device)
            recv = torch.empty(self.size * m, dtype=torch.uint8, device=self.device)
        self._last = None
        outs = list(recv.split(m))
        work = dist.all_gather(outs, send_t, group=_alive(self.group_ref, self.name),
                               async_op=True)
        self._last = (work, outs, send_t, recv)
        self._wait(work, "all_gather")
        if self.device is not None:
            recv_np = recv.cpu().numpy()  # synchronizes
        flags = recv_np[::m].tobytes()
        if any(flags):
            first = next(r for r, f in enumerate(flags) if f)
            raise _TransportFailure(_overlap_message(self.name, first))
        # A contiguous copy first: tobytes() of the strided view copies byte by byte (60x slower).
        return np.ascontiguousarray(recv_np.reshape(self.size, m)[:, 1:]).tobytes()

    def barrier(self):
        self._reported("barrier", self._barrier)

    def _barrier(self):
        self._last = None
        work = _dist().barrier(group=_alive(self.group_ref, self.name), async_op=True)
        self._last = work
        self._wait(work, "barrier")


class TorchDistributedComm(_detlogp.CallbackComm):
    """A detlogp Communicator over a torch.distributed process group.

    ``group=None`` means the default (world) group. The process group must be initialized
    (``torch.distributed.init_process_group``) and this process must be a member of it.
    ``device``: where the gathered bytes travel; "auto" follows the backend
    (``transport_device``), None forces CPU tensors, a torch.device forces device tensors.
    ``timeout``: seconds (or a ``datetime.timedelta``) one collective waits for the other ranks
    before raising ``RuntimeError``; default ``DEFAULT_COLLECTIVE_TIMEOUT``. Pass it as
    ``group=`` to an op call to use it.

    The C++ side holds only the two bound methods of its ``_Callbacks`` (no reference back to
    this object); the group (weakly: it is cached per group, see ``_weak_group``) and the
    group's call guard are kept here.
    """

    def __init__(self, group=None, device="auto", timeout=None):
        timeout = _check_timeout(timeout)
        dist = _dist()
        if not dist.is_available() or not dist.is_initialized():
            raise LogprobContractError(
                "a torch.distributed group requires an initialized process group "
                "(torch.distributed.init_process_group) on every TP rank")
        if group is None:
            group = dist.group.WORLD
        rank = dist.get_rank(group)
        if rank < 0:
            raise LogprobContractError("this process is not a member of the given process group")
        size = dist.get_world_size(group)
        backend = dist.get_backend(group)
        name = f"torch.distributed:{backend}"
        guard = _guard_of_group(group)
        cb = _Callbacks(_weak_group(group), rank, size, name, timeout,
                        transport_device(backend) if device == "auto" else device, guard)
        super().__init__(rank, size, name, cb.all_gather, cb.barrier)
        self._group_ref = cb.group_ref
        self.guard = guard

    @property
    def group(self):
        """The process group (raises RuntimeError once it has been destroyed)."""
        return _alive(self._group_ref, self.name)


def communicator_for(group, tp_world_size):
    """The Communicator of an op call: ``group=None`` is the group of one (SelfComm); a
    torch.distributed ProcessGroup (or ``torch.distributed.group.WORLD``) is wrapped; a detlogp
    Communicator is used as is."""
    if isinstance(group, Communicator):
        return group
    if group is not None and tp_world_size == 1:
        comm = TorchDistributedComm(group)
        if comm.size == 1:
            return comm
        raise LogprobContractError(
            f"the contract says tp_world_size=1 but the group has {comm.size} ranks: pass "
            "group=None for a single TP rank, or build the contract with the group's size as "
            "tp_world_size")
    if group is None:
        if tp_world_size > 1:
            raise LogprobContractError(
                f"tp_world_size={tp_world_size} requires an initialized process group: pass "
                "group=<the TP process group> (torch.distributed), not None")
        return None  # SelfComm, made in C++
    return TorchDistributedComm(group)
