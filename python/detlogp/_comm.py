"""Communicators: a torch.distributed process group as detlogp's transport.

detlogp's C++ operator talks to a ``Communicator`` (include/detlogp/comm.hpp): rank, size,
an all-gather of equal-size byte buffers and a barrier. ``TorchDistributedComm`` is one whose
collectives call back into Python (taking the GIL) and run ``torch.distributed.all_gather``
over uint8 tensors of the given process group (gloo on CPU), and ``dist.barrier(group)``.
The buffers are wrapped, not copied (``torch.frombuffer``); a collective only moves bytes.

Where the bytes travel follows the group's backend: a gloo (or MPI) group all-gathers CPU
tensors; any other backend (NCCL, ...) cannot, so the (small: a few bytes per token) buffers
are copied to a tensor on the group's device (the current CUDA device for NCCL), gathered
there and copied back.

No collective waits forever: each one is started with ``async_op=True`` and waited for with
``Work.wait(timeout)``, ``timeout`` seconds (``DEFAULT_COLLECTIVE_TIMEOUT`` unless given, as the
C++ transports). On expiry the waiting rank raises ``RuntimeError`` naming the collective, the
rank, the group and the timeout.
"""

import datetime
import math

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


class _Callbacks:
    """The Python half of a TorchDistributedComm (kept separate so the C++ object holds only
    two bound methods). ``device``: None for CPU tensors, else where the bytes travel."""

    def __init__(self, group, rank, size, name, timeout, device=None):
        self.group = group
        self.rank = rank
        self.size = size
        self.name = name
        self.timeout = timeout
        self.device = device

    def _wait(self, work, collective):
        try:
            work.wait(datetime.timedelta(seconds=self.timeout))
        except RuntimeError as error:
            raise _TransportFailure(self._failure(collective, error)) from error

    def _reported(self, collective, start):
        """Runs ``start()`` (a collective, started and waited for); a RuntimeError the transport
        raises while starting it (a peer already gone) is reported like one raised by the wait."""
        try:
            start()
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

    def all_gather(self, send_view, recv_view, in_place):
        self._reported("all_gather", lambda: self._all_gather(send_view, recv_view, in_place))

    def _all_gather(self, send_view, recv_view, in_place):
        if self.device is not None:
            self._all_gather_on_device(send_view, recv_view)
            return
        import torch

        dist = _dist()
        n = len(send_view)
        if n == 0:
            # Zero bytes still synchronise, like every collective; gloo cannot all-gather
            # empty tensors (it divides by the size), so gather one dummy byte instead.
            outs = [torch.empty(1, dtype=torch.uint8) for _ in range(self.size)]
            work = dist.all_gather(outs, torch.zeros(1, dtype=torch.uint8), group=self.group,
                                   async_op=True)
            self._wait(work, "all_gather")
            return
        send = torch.frombuffer(send_view, dtype=torch.uint8)
        if in_place:  # send is our own block of recv: gather from a private copy
            send = send.clone()
        recv = torch.frombuffer(recv_view, dtype=torch.uint8)
        outs = list(recv.split(n))  # views into recv, in rank order
        work = dist.all_gather(outs, send, group=self.group, async_op=True)
        self._wait(work, "all_gather")
        del outs, recv, send

    def _all_gather_on_device(self, send_view, recv_view):
        """The same gather through device tensors (backends without CPU collectives)."""
        import torch

        dist = _dist()
        n = len(send_view)
        m = max(n, 1)  # zero bytes still synchronise: gather one dummy byte
        send = torch.zeros(m, dtype=torch.uint8, device=self.device)
        if n:
            send.copy_(torch.frombuffer(send_view, dtype=torch.uint8))
        recv = torch.empty(m * self.size, dtype=torch.uint8, device=self.device)
        # A list of views into one tensor: NCCL and gloo both take it (gloo of torch 1.13 has
        # no all_gather_into_tensor), so the device path is exercised by the CPU tests too.
        work = dist.all_gather(list(recv.split(m)), send, group=self.group, async_op=True)
        self._wait(work, "all_gather")
        if n:
            torch.frombuffer(recv_view, dtype=torch.uint8).copy_(recv)  # synchronizes
        del send, recv

    def barrier(self):
        self._reported("barrier", lambda: self._wait(
            _dist().barrier(group=self.group, async_op=True), "barrier"))


def TorchDistributedComm(group=None, device="auto", timeout=None):  # noqa: N802 - a class
    """A detlogp Communicator over a torch.distributed process group.

    ``group=None`` means the default (world) group. The process group must be initialized
    (``torch.distributed.init_process_group``) and this process must be a member of it.
    ``device``: where the gathered bytes travel; "auto" follows the backend
    (``transport_device``), None forces CPU tensors, a torch.device forces device tensors.
    ``timeout``: seconds (or a ``datetime.timedelta``) one collective waits for the other ranks
    before raising ``RuntimeError``; default ``DEFAULT_COLLECTIVE_TIMEOUT``. Pass the result as
    ``group=`` to an op call to use it.
    """
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
    cb = _Callbacks(group, rank, size, name, timeout,
                    transport_device(backend) if device == "auto" else device)
    return _detlogp.CallbackComm(rank, size, name, cb.all_gather, cb.barrier)


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
