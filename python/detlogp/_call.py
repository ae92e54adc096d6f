"""One call of the logits operator, prepared once and run by one runner.

Both front ends end here: the object API (``LogprobOp``, _op.py) and ``detlogp.torch`` each
check and convert the caller's inputs once (_buffers.py) into a ``LogitsCall``, and
``LogitsCall.run`` is the only place the C++ forward is called. The fused lm_head (_fused.py)
runs through ``run_exclusive`` and ``join_without_tokens`` too.

Rows layouts: at TP > 1, row i of every rank is merged with row i of the others, so the
preflight compares which token each rank's row i is (``rows_layout``, "" when the rows are the
tokens in order). When the ranks differ every rank raises LogprobContractError (field
"rows_layout"), and every rank joins one more preflight with its rows in token order: a rank
whose rows already are runs the same call again, a rank whose rows are not reads them again
in token order (``detlogp.torch`` does; the object API's rows are always in token order).
"""

import numpy as np

from . import _detlogp
from ._buffers import grad_array, is_tensor, on_device, platform_of, raw_view, torch_module
from ._call_cache import DEFAULT_CACHE
from ._comm import exclusive
from ._detlogp import LogprobContractError
from ._storage import check_stamp, stamp

__all__ = ["LogitsCall", "LogprobForward", "run_exclusive", "join_without_tokens",
           "is_layout_disagreement"]


def is_layout_disagreement(error):
    """Whether ``error`` is the preflight's "ranks disagree on the rows layout" (every rank of
    the call got it, from the same records)."""
    return isinstance(error, LogprobContractError) and \
        getattr(error, "field", "") == "rows_layout"


def run_exclusive(comm, call, again=None):
    """``call()`` as the only call of ``comm``'s process group in this process (_comm.py,
    ``exclusive``). With ``again``: when the preflight reports that the ranks' rows layouts
    differ, ``again()`` joins the one more preflight (inside the same exclusive section). Any
    other error propagates."""
    with exclusive(comm):
        if again is None:
            return call()
        try:
            return call()
        except LogprobContractError as error:
            if not is_layout_disagreement(error):
                raise
        return again()


def join_without_tokens(comm):
    """A call without tokens: at TP > 1 it joins its peers' preflight with zero rows (they all
    have none, or every rank raises); nothing is computed."""
    if comm is None or comm.size < 2:
        return

    def call():
        _detlogp.preflight_no_tokens(comm)

    run_exclusive(comm, call, call)


class LogitsCall:
    """Everything one forward of the logits operator needs, checked and converted: the C++ op
    for the logits' platform, the logits (the owner of ``view``, the raw view the operator
    reads), int64 ``targets``, the contract, the communicator (None: one rank) and the options.
    """

    __slots__ = ("cpp", "backend_id", "platform", "logits", "view", "targets", "contract",
                 "comm", "deterministic", "validate", "entropy", "entropy_grad", "threads",
                 "rows_layout", "row_temperature", "kept_ids", "outside_neg_inf", "top_k",
                 "top_p", "empty_kept_full")

    def __init__(self, *, cpp, backend_id, platform, logits, view, targets, contract, comm,
                 deterministic, validate, entropy, entropy_grad, threads, rows_layout="",
                 row_temperature=None, kept_ids=None, outside_neg_inf=False, top_k=None,
                 top_p=None, empty_kept_full=False):
        self.cpp, self.backend_id, self.platform = cpp, backend_id, platform
        self.logits, self.view, self.targets = logits, view, targets
        self.contract, self.comm = contract, comm
        self.deterministic, self.validate, self.threads = deterministic, validate, threads
        self.entropy, self.entropy_grad = entropy, entropy_grad
        self.rows_layout = rows_layout
        self.row_temperature = row_temperature  # float32 [rows] or None: the contract's
        self.kept_ids = kept_ids  # int64 [rows, K] (-1 padded) or None: the full vocabulary
        self.outside_neg_inf = outside_neg_inf  # a target outside its kept set: -inf, not error
        # Recomputed kept sets: int32 / float32 [rows] or None (docs/numerics.md "Recomputed
        # kept sets (top-k, top-p)").
        self.top_k, self.top_p = top_k, top_p
        self.empty_kept_full = empty_kept_full  # kept ids all -1: the full vocabulary

    def _forward(self):
        with on_device(self.logits, self.platform):
            handle = self.cpp.forward(
                logits=self.view, owner=self.logits, targets=self.targets,
                contract=self.contract._cpp, comm=self.comm, deterministic=self.deterministic,
                validate=self.validate, entropy=self.entropy, threads=self.threads,
                entropy_grad=self.entropy_grad, rows_layout=self.rows_layout,
                row_temperature=self.row_temperature, kept_ids=self.kept_ids,
                outside_neg_inf=self.outside_neg_inf, top_k=self.top_k, top_p=self.top_p,
                empty_kept_full=self.empty_kept_full)
        return LogprobForward(handle, self.logits, self.platform, self.backend_id)

    def run(self, again=None):
        """The forward: a ``LogprobForward``. ``again``: how this rank joins the preflight once
        more when the ranks' rows layouts differ (module docstring); None: rows in token order
        run the same call again, other rows raise."""
        if again is None and not self.rows_layout:
            again = self._forward
        return run_exclusive(self.comm, self._forward, again)


class LogprobForward:
    """The outputs of one forward (``logp``, ``lse``, ``entropy`` or None; torch tensors for
    torch input, NumPy arrays for NumPy input) and ``backward()`` for this rank's shard.

    Holds a reference to the logits: they must stay unchanged until backward is done, and
    their storage allocated where it was (checked: detlogp/_storage.py).
    """

    __slots__ = ("_handle", "_logits", "_stamp", "_torch_out", "platform", "backend_id", "logp",
                 "lse", "entropy")

    def __init__(self, handle, logits, platform="cpu", backend_id=None):
        self._handle = handle
        self._logits = logits
        self._stamp = stamp(logits)
        self._torch_out = is_tensor(logits)
        self.platform = platform  # "cpu" or "cuda": where it ran
        self.backend_id = backend_id  # the backend that ran
        if self._torch_out and platform == "cuda":
            device = logits.device

            def convert(a):
                return torch_module().from_numpy(a).to(device)
        elif self._torch_out:
            convert = torch_module().from_numpy
        else:
            def convert(a):
                return a
        self.logp = convert(handle.logp)
        self.lse = convert(handle.lse)
        ent = handle.entropy
        self.entropy = None if ent is None else convert(ent)

    @property
    def kept_ids(self):
        """The call's kept sets (given or recomputed), int64 NumPy [rows, width] (-1 padded),
        or None without kept sets."""
        return self._handle.kept_ids

    @property
    def saved_logits_data_ptr(self):
        """Address of the logits buffer backward reads: the caller's (no copy was made)."""
        return self._handle.saved_logits_data_ptr

    def outputs(self):
        if self.entropy is None:
            return self.logp, self.lse
        return self.logp, self.lse, self.entropy

    def backward(self, grad_logp=None, grad_lse=None, grad_entropy=None, out=None):
        """Gradient of this rank's logits shard for the given per-token output gradients
        (None: not supplied). Returns a new array/tensor of the logits' shape and dtype (a
        torch tensor may reuse the memory of an earlier gradient that nothing refers to any
        more), or writes into ``out``, which must have that shape and dtype. No collective."""
        x = self._logits
        check_stamp(x, self._stamp, "the logits")
        if out is None:
            if self._torch_out:
                # A pooled buffer where one is free (no page faults on first touch), else a
                # fresh one (detlogp/_call_cache.py).
                out = DEFAULT_CACHE.grad_buffer(x.shape[0], x.shape[1], x.dtype, x.device)
            else:
                out = np.empty(x.shape, dtype=x.dtype)
        out_platform = platform_of(out, "out")
        view = raw_view(out)
        if is_tensor(out) and out.requires_grad:
            raise LogprobContractError("out must not require grad")
        if not is_tensor(out) and not out.flags.writeable:
            raise LogprobContractError("out must be writeable")
        if self.platform == "cuda" and (not is_tensor(out) or out.device != x.device):
            where = out.device if is_tensor(out) else "a NumPy array"
            raise LogprobContractError(
                f"out must live on the logits' device {x.device}; got {where}")
        if self.platform == "cpu" and out_platform != "cpu":
            raise LogprobContractError(
                f"out must be a CPU tensor or a NumPy array like the logits; got {out.device}")
        with on_device(out, out_platform):
            self._handle.backward(grad_logp=grad_array(grad_logp), grad_lse=grad_array(grad_lse),
                                  grad_entropy=grad_array(grad_entropy), out=view)
        return out

