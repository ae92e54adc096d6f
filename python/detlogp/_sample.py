"""``detlogp.sample``: deterministic sampling on the rollout side (docs/python.md, "Sampling on
the rollout side"; the canon: docs/numerics.md "Sampling").

    out = detlogp.sample(logits, seeds, positions, temperature=t, top_k=k, top_p=p,
                         group=tp_group, vocab_start=table, real_vocab=R, num_logprobs=5)
    out.tokens, out.logprobs, out.kept  # what the trainer's vocab_parallel_logprobs takes back

Each row's token is drawn by Gumbel-max with Philox4x32-10 keyed by the row's seed and counted
by its position, so it depends on the row's scored logits, seed and position only (not on the
TP degree, the shard bounds, the batch or the threads); its logprobs are bitwise what
``detlogp.torch.vocab_parallel_logprobs`` computes for it. The C++ call is detlogp::sample
(include/detlogp/sampler.hpp); the arguments are read by the helpers the trainer's entry point
uses (vocab bounds, real vocabulary, top_k / top_p, group, contract cache).
"""

from typing import NamedTuple

import numpy as np

from . import _detlogp
from ._buffers import is_tensor, kernel_threads, tensor_view, torch_module
from ._call import join_without_tokens, run_exclusive
from ._call_cache import DEFAULT_CACHE
from ._checks import check_int, is_int
from ._comm import peers_fail_on_error
from ._contract import ReductionSpec, ShardingSpec, _softcap
from ._detlogp import LogprobContractError
from ._dtypes import name_of_tensor
from ._group import resolve_group
from ._kept import selection_argument
from ._op import LogprobOp, get_logprob_op

__all__ = ["sample", "SampleOutput"]

_NO_IGNORE = -100


class SampleOutput(NamedTuple):
    """The outputs of ``detlogp.sample``, torch tensors on the logits' device, replicated on
    every TP rank.

    ``tokens`` int64 [rows]; ``logprobs`` fp32 [rows]: the token's logprob over its kept set
    (renormalised; the full one on unrestricted rows), bitwise ``vocab_parallel_logprobs(logits,
    tokens, temperature=t, top_k=k, top_p=p)``; ``full_logprobs`` fp32 [rows]: bitwise
    ``vocab_parallel_logprobs(logits, tokens, temperature=t)``; ``kept`` int64 [rows, width]:
    each row's kept ids ascending, -1 padded (width 0 when no row is restricted; an
    unrestricted row of a mixed batch is all -1), what the trainer's ``kept_ids=`` takes;
    ``top_ids`` int64 [rows, N] and ``top_logprobs`` fp32 [rows, N]: each row's first N ids of
    the ranking (z descending, then id ascending) with their full-vocabulary logprobs."""

    tokens: object
    logprobs: object
    full_logprobs: object
    kept: object
    top_ids: object
    top_logprobs: object


def _bits64(value, name):
    """A Python integer in [-2^63, 2^64) as the int64 with its 64 bits (a seed is its bits)."""
    if not -2**63 <= value < 2**64:
        raise LogprobContractError(
            f"{name} value {value} does not fit in 64 bits; pass an integer in [-2^63, 2^64)")
    return value - 2**64 if value >= 2**63 else value


def _per_row_ints(value, name, rows):
    """``seeds`` / ``positions``: an int (every row's) or a 1-D integer tensor / array / list,
    as contiguous int64 NumPy with each value's 64 bits (uint64 values above 2^63 wrap: a seed
    is its bits; a position that large is negative and refused by the C++ call, which checks
    lengths and values, field ``name``)."""
    if not is_tensor(value) and not isinstance(value, np.ndarray) and is_int(value):
        return np.full(rows, _bits64(int(value), name), dtype=np.int64)
    if is_tensor(value):
        if value.dtype.is_floating_point or value.dtype.is_complex or \
                value.dtype == torch_module().bool:
            raise LogprobContractError(f"{name} must hold integers; got dtype {value.dtype}")
        value = value.detach().to(device="cpu", dtype=torch_module().int64).numpy()
    elif isinstance(value, (list, tuple)) and all(is_int(v) for v in value):
        value = np.array([_bits64(int(v), name) for v in value], dtype=np.int64)
    a = np.asarray(value)
    if a.dtype.kind not in "iu" and a.size:
        raise LogprobContractError(f"{name} must hold integers; got dtype {a.dtype}")
    if a.ndim != 1:
        raise LogprobContractError(f"{name} must be 1-D [rows] (one per row); got shape "
                                   f"{a.shape}")
    if a.dtype == np.uint64:
        return np.ascontiguousarray(a).view(np.int64)
    return np.ascontiguousarray(a, dtype=np.int64)


def _per_row_temperature(temperature, rows):
    """A number (every row's) or a 1-D floating-point tensor / array, as fp32 NumPy [rows] (0 is
    greedy; the values are checked by the C++ call, field "temperature")."""
    if is_tensor(temperature):  # the trainer's rule for per-token temperatures (torch loaded)
        from ._torch_args import token_temperature

        return token_temperature(temperature, (rows,)).numpy()
    if isinstance(temperature, np.ndarray):
        return np.ascontiguousarray(temperature, dtype=np.float32)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating)):
        raise LogprobContractError(
            f"temperature must be a number or a tensor of one value per row; got "
            f"{type(temperature).__name__}")
    return np.full(rows, float(temperature), dtype=np.float32)


def _empty(rows, n, device):
    torch = torch_module()
    ints = torch.zeros(0, dtype=torch.int64, device=device)
    floats = torch.zeros(0, dtype=torch.float32, device=device)
    return SampleOutput(ints, floats, floats, ints.view(0, 0), ints.view(0, n).clone(),
                        floats.view(0, n).clone())


def sample(logits, seeds, positions, *, temperature=1.0, top_k=None, top_p=None, softcap=None,
           group=None, real_vocab=None, vocab_start=None, num_logprobs=0, threads=None):
    """One token per row of ``logits`` [rows, local_vocab] (fp32, bf16 or fp16): the full rows
    (``group=None``) or this rank's vocab-parallel shard (``group=`` the TP group and
    ``vocab_start=`` this rank's first column or the table [(start, end), ...] of every rank,
    exactly as ``vocab_parallel_logprobs``; default: equal shards). ``seeds`` and
    ``positions``: int64 [rows] (or an int for every row): each row's request seed and its
    position in the request's output, the draw's only randomness. ``temperature``: a number or
    fp32 [rows]; 0 is greedy (the first id of the ranking, ties to the lower id, scored at
    temperature 1). ``top_k`` / ``top_p``: an int / a number or per-row tensors (0 / 1: off);
    rows may mix restricted and unrestricted. ``softcap`` and ``real_vocab`` as
    ``vocab_parallel_logprobs``. ``num_logprobs``: N, each row's first N ids and their logprobs.
    ``threads``: kernel threads (default ``torch.get_num_threads()``; the bits never depend on
    it). Returns a ``SampleOutput``. At TP > 1 every rank must pass the same seeds, positions,
    temperatures, top_k, top_p and num_logprobs (compared: LogprobContractError on every rank
    otherwise)."""
    group = resolve_group(group, "sample", infer=False)
    comm = DEFAULT_CACHE.communicator(group)
    with peers_fail_on_error(comm):
        from ._torch_args import real_vocab_size, vocab_bounds  # imports torch

        torch = torch_module()
        if not isinstance(logits, torch.Tensor):
            raise LogprobContractError(
                f"logits must be a torch.Tensor; got {type(logits).__name__}")
        if logits.layout != torch.strided or logits.dim() != 2:
            raise LogprobContractError(
                f"logits must be a 2-D strided tensor [rows, local_vocab]; got shape "
                f"{tuple(logits.shape)} ({logits.layout})")
        dtype = name_of_tensor(logits, "logits")
        n = check_int(num_logprobs, "num_logprobs", "non-negative")
        device = logits.device
        rows, cols = logits.shape
        tp, rank = (comm.size, comm.rank) if comm is not None else (1, 0)
        bounds, padded = vocab_bounds(vocab_start, cols, tp, rank)
        inferred = not isinstance(vocab_start, (list, tuple))
        real = real_vocab_size(real_vocab, padded, cols, tp, inferred)
        seeds = _per_row_ints(seeds, "seeds", rows)
        positions = _per_row_ints(positions, "positions", rows)
        tau = _per_row_temperature(temperature, rows)
        k, p = selection_argument(top_k, top_p, (rows,))
        k = None if k is None else k.numpy()
        p = None if p is None else p.numpy()
        cap = _softcap(softcap)
        threads = kernel_threads(threads, logits)
        # The sampler scans host memory: a GPU shard is read once on the CPU (the bits are the
        # canon's wherever it runs); a view that is not contiguous in the vocab dim is copied.
        x = logits.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if cols > 1 and x.stride(1) != 1:
            x = x.contiguous()
        if rows == 0:
            out = None
        else:
            key = ("sample", rows, dtype, tp, rank, bounds, real, padded, cap)
            contract = DEFAULT_CACHE.contract(
                key, np.ones(rows, dtype=np.uint8), _NO_IGNORE,
                lambda: _sharding(rank, tp, bounds, real, padded), dtype, 1.0, None,
                ReductionSpec(), cap, role="infer")
            dispatch = DEFAULT_CACHE.op(key + ("cpu",),
                                        lambda: get_logprob_op(contract, "auto", platform="cpu"))
            op = dispatch.op
            if not isinstance(op, LogprobOp):
                raise LogprobContractError(
                    f"backend {dispatch.actual_backend} is defined in Python: detlogp.sample "
                    "needs a backend defined in C++ (the canon's kernels)")
            out = (op, contract)
    if out is None:
        join_without_tokens(comm)
        return _empty(rows, n, device)
    op, contract = out
    view = tensor_view(x, dtype)

    def call():
        return _detlogp.sample(op=op._cpp, logits=view, contract=contract._cpp, comm=comm,
                               seeds=seeds, positions=positions, temperature=tau, top_k=k,
                               top_p=p, num_logprobs=n, threads=threads)

    tokens, logp, full, kept, top_ids, top_logp = run_exclusive(comm, call)

    def to(a):
        return torch.from_numpy(a).to(device)

    return SampleOutput(to(tokens), to(logp), to(full), to(kept), to(top_ids), to(top_logp))


def _sharding(rank, tp, bounds, real, padded):
    return ShardingSpec(tp_rank=rank, tp_world_size=tp, vocab_shard_bounds=list(bounds),
                        real_vocab_size=real, padded_vocab_size=padded)
