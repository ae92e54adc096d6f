"""The distributed drift report: the operator on real ranks over TP x CP topologies against a
float64 oracle (docs/drift-report.md).

One topology, launched by torchrun (or mpirun) with TP*CP processes on gloo:

    torchrun --nnodes=1 --nproc_per_node=4 -m detlogp.drift_report --tp 2 --cp 2 \\
        --output tp2-cp2.json

Every rank scores its token slice (CP) of its vocabulary shard (TP) through a fresh registry
dispatch with an explicit backend, checks that its TP group holds bitwise identical outputs,
compares them with the oracle and with the oracle's view of its own shard, and global rank 0
writes one JSON report (per-rank reports, an aggregate over the whole batch, bitwise
fingerprints of the outputs). Exit status 1 when the topology fails.

The planned topologies, and running all of them:

    python -m detlogp.drift_report --plan --output-dir reports/     # the commands, as JSON
    python -m detlogp.drift_report --launch --output-dir reports/   # runs them; summary.json

For testing the report itself, ``--perturb-rank R --perturb-delta X`` (or the environment
variable DETLOGP_DRIFT_REPORT_PERTURB="R:X") adds X to the real-vocabulary logits of global
rank R before they reach the operator: a planted disagreement the report must name.
"""

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform as _platform
import shlex
import socket
import subprocess
import sys

import numpy as np

from . import _detlogp
from ._atomic_file import AtomicOutputFile
from ._checks import check_int
from ._contract import LogprobContract, MaskSpec, ShardingSpec, even_tile_aligned_bounds
from ._detlogp import LogprobContractError
from ._drift import drift
from ._dtypes import torch_dtype
from ._registry import Registry

__all__ = ["DriftCase", "PLANNED_TOPOLOGIES", "plan", "rank_layout", "token_bounds",
           "launch_command", "run_topology", "spawn_local", "launch", "main"]

SCHEMA_VERSION = 1
#: TP-major: (1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2).
PLANNED_TOPOLOGIES = tuple((tp, cp) for tp in (1, 2, 4) for cp in (1, 2))
PERTURB_ENV = "DETLOGP_DRIFT_REPORT_PERTURB"
_POLICIES = ("production", "reference")
_PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=5)
_PEER_GRACE_S = 5.0  # spawn_local: how long the other ranks may take to fail on their own


def _positive(value, field):
    if type(value) is not int or value <= 0:
        raise LogprobContractError(f"{field} must be a positive integer; got {value!r}")
    return check_int(value, field, "positive")  # and it fits in 64 bits


@dataclasses.dataclass(frozen=True)
class DriftCase:
    """One topology's inputs: what every rank regenerates from ``batch_key`` and scores."""

    tp: int
    cp: int
    dtype: str = "bf16"
    backend: str = _detlogp.CPU_CANONICAL_BACKEND_ID
    real_vocab: int = 151936
    padded_vocab: int = 151936
    num_vocab_tiles: int = 64
    batch: int = 2
    seq: int = 16
    prompt_tokens: int = 8
    batch_key: int = 123
    ignore_index: int = -100
    logit_scale: float = 2.0

    def __post_init__(self):
        for f in ("tp", "cp", "real_vocab", "padded_vocab", "num_vocab_tiles", "batch", "seq"):
            _positive(getattr(self, f), f)
        if self.dtype not in ("bf16", "fp16", "fp32"):
            raise LogprobContractError(f"dtype must be one of: bf16, fp16, fp32; got "
                                       f"{self.dtype!r}")
        if not isinstance(self.backend, str) or not self.backend.strip() \
                or self.backend.strip().lower() == "auto":
            raise LogprobContractError(
                f"backend must be an explicit non-auto backend (an id, or production / "
                f"reference); got {self.backend!r}")
        if self.padded_vocab < self.real_vocab:
            raise LogprobContractError(f"padded_vocab={self.padded_vocab} must not be smaller "
                                       f"than real_vocab={self.real_vocab}")
        if self.num_vocab_tiles < self.tp:
            raise LogprobContractError(f"num_vocab_tiles={self.num_vocab_tiles} must be at "
                                       f"least tp={self.tp} (every rank holds a whole tile)")
        if self.padded_vocab % self.num_vocab_tiles:
            raise LogprobContractError(f"num_vocab_tiles={self.num_vocab_tiles} must divide "
                                       f"padded_vocab={self.padded_vocab} exactly")
        if type(self.prompt_tokens) is not int or not 0 <= self.prompt_tokens <= self.seq:
            raise LogprobContractError(f"prompt_tokens must lie in [0, seq={self.seq}]; got "
                                       f"{self.prompt_tokens!r}")
        if self.tokens < self.cp:
            raise LogprobContractError(f"batch*seq={self.tokens} tokens cannot be split over "
                                       f"cp={self.cp} ranks")
        if not (isinstance(self.logit_scale, (int, float)) and 0 < self.logit_scale < math.inf):
            raise LogprobContractError(f"logit_scale must be finite and > 0; got "
                                       f"{self.logit_scale!r}")
        # torch's generator takes seeds in [-2^63, 2^64).
        if type(self.batch_key) is not int or not -(2**63) <= self.batch_key < 2**64:
            raise LogprobContractError(f"batch_key must be an integer in [-2^63, 2^64); got "
                                       f"{self.batch_key!r}")
        check_int(self.ignore_index, "ignore_index")

    @property
    def world_size(self):
        return self.tp * self.cp

    @property
    def tokens(self):
        return self.batch * self.seq

    @property
    def tile_width(self):
        return self.padded_vocab // self.num_vocab_tiles

    def to_dict(self):
        return dataclasses.asdict(self)

    @property
    def case_id(self):
        """First 16 hex digits of the SHA-256 of the case's compact, key-sorted JSON."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def vocab_bounds(self):
        """Whole tiles per TP rank; the first (tiles mod tp) ranks take one extra tile."""
        return even_tile_aligned_bounds(self.padded_vocab, self.tp, self.tile_width)


def token_bounds(tokens, cp):
    """Contiguous token slices per CP rank; the first (tokens mod cp) ranks take one more."""
    if tokens < cp:
        raise LogprobContractError(f"{tokens} tokens cannot be split over cp={cp} ranks")
    base, extra = divmod(tokens, cp)
    out, start = [], 0
    for r in range(cp):
        end = start + base + (1 if r < extra else 0)
        out.append((start, end))
        start = end
    return out


def rank_layout(tp, cp, rank):
    """(tp_rank, cp_rank, TP group) of a global rank: TP groups are contiguous blocks."""
    cp_rank, tp_rank = divmod(rank, tp)
    return tp_rank, cp_rank, tuple(range(cp_rank * tp, cp_rank * tp + tp))


def _case_args(case):
    return ["--tp", str(case.tp), "--cp", str(case.cp), "--dtype", case.dtype,
            "--backend", case.backend, "--real-vocab", str(case.real_vocab),
            "--padded-vocab", str(case.padded_vocab), "--num-vocab-tiles",
            str(case.num_vocab_tiles), "--batch", str(case.batch), "--seq", str(case.seq),
            "--prompt-tokens", str(case.prompt_tokens), "--batch-key", str(case.batch_key),
            "--ignore-index", str(case.ignore_index), "--logit-scale", str(case.logit_scale)]


def launch_argv(case, output, master_port=29500):
    """torchrun's argv for one topology (single node, static rendezvous on 127.0.0.1)."""
    return (["torchrun", "--nnodes=1", f"--nproc_per_node={case.world_size}",
             "--master_addr=127.0.0.1", f"--master_port={master_port}", "-m",
             "detlogp.drift_report"] + _case_args(case)
            + ["--dist-backend", "gloo", "--output", str(output)])


def launch_command(case, output, master_port=29500):
    """The shell command that produces this topology's report."""
    return shlex.join(launch_argv(case, output, master_port))


def plan(template, output_dir, topologies=PLANNED_TOPOLOGIES):
    """[(case, output path, command)] for each topology, writing tp{T}-cp{C}.json."""
    out = []
    for tp, cp in topologies:
        case = dataclasses.replace(template, tp=tp, cp=cp)
        path = os.path.join(str(output_dir), f"tp{tp}-cp{cp}.json")
        out.append((case, path, launch_command(case, path)))
    return out


# --- inputs and oracle ---------------------------------------------------------------------------


def _active(case, start, end):
    """The active mask of tokens [start, end): every position but the first prompt_tokens of
    each sequence is scored."""
    import torch

    return torch.arange(start, end) % case.seq >= case.prompt_tokens


def _inputs(case):
    """fp32 logits [tokens, padded] (padding columns hold junk), targets and the active mask."""
    import torch

    g = torch.Generator().manual_seed(case.batch_key)
    logits = torch.randn(case.tokens, case.padded_vocab, generator=g) * case.logit_scale
    logits[:, case.real_vocab:] = 1e4  # must never leak into a result
    targets = torch.randint(0, case.real_vocab, (case.tokens,), generator=g)
    active = _active(case, 0, case.tokens)
    targets[~active] = case.ignore_index
    return logits, targets, active


def _memory_needed(case, rank):
    """Bytes global rank ``rank`` holds at its peak (sizes overflowing 64 bits are refused):
    the regenerated fp32 logits [tokens, padded] (twice while they are scaled), its shard and
    the shard cast to the case dtype, and the float64 oracle over the real vocabulary (the
    upcast rows, their shifted copy and its exponential); rank 0 then recomputes the oracle
    over the whole batch for the aggregate."""
    tp_rank, cp_rank, _ = rank_layout(case.tp, case.cp, rank)
    t0, t1 = token_bounds(case.tokens, case.cp)[cp_rank]
    v0, v1 = case.vocab_bounds()[tp_rank]
    esz = {"bf16": 2, "fp16": 2, "fp32": 4}[case.dtype]
    product = _detlogp.checked_product
    logits = product([case.tokens, case.padded_vocab, 4], "the logits (--batch x --seq x "
                     "--padded-vocab)")
    shard = product([t1 - t0, v1 - v0, 4 + esz], "this rank's logits shard")
    oracle = product([3, t1 - t0, case.real_vocab, 8], "the float64 oracle (tokens x "
                     "--real-vocab)")
    need = logits + max(logits, shard + oracle)
    if rank == 0:
        whole = product([3, case.tokens, case.real_vocab, 8], "the float64 oracle of the batch "
                        "(--batch x --seq x --real-vocab)")
        need = max(need, logits + max(logits, whole))
    return need


def _local_ranks(rank, world):
    """The global ranks that share this machine: the launcher's block of LOCAL_WORLD_SIZE
    (torchrun) or OMPI_COMM_WORLD_LOCAL_SIZE (mpirun) ranks around this one; the whole world
    when it says nothing."""
    for rank_var, size_var in (("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                               ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")):
        try:
            local_rank, local_size = int(os.environ[rank_var]), int(os.environ[size_var])
        except (KeyError, ValueError):
            continue
        first = rank - local_rank
        if 0 <= local_rank < local_size and first >= 0 and first + local_size <= world:
            return range(first, first + local_size)
    return range(world)


def _check_memory(case, rank, world):
    """The command line's memory rule (src/memory/memory.cpp): every rank on this machine at its
    peak must fit in what this process may still allocate."""
    local = _local_ranks(rank, world)
    needed = sum(_memory_needed(case, r) for r in local)
    if needed >= 1 << 64:
        raise LogprobContractError(f"the memory of the {len(local)} ranks on this machine "
                                   f"overflows 64-bit sizes ({needed} bytes)")
    _detlogp.require_memory(
        needed,
        f"the drift report at TP {case.tp} x CP {case.cp} ({len(local)} rank"
        f"{'s' if len(local) != 1 else ''} on this machine) of --batch {case.batch} x --seq "
        f"{case.seq} tokens x --padded-vocab {case.padded_vocab} (--real-vocab "
        f"{case.real_vocab})",
        "use fewer tokens (--batch, --seq) or a smaller vocabulary (--real-vocab, "
        "--padded-vocab)")


def _oracle(logits_rows, targets, active, real_vocab):
    """float64 (logp, lse) over the real vocabulary of fp32 logits rows."""
    import torch

    z = logits_rows[:, :real_vocab].double()
    lse = torch.logsumexp(z, dim=-1)
    safe = torch.where(active, targets, torch.zeros_like(targets))
    logp = torch.where(active, z.gather(1, safe[:, None])[:, 0] - lse, torch.zeros_like(lse))
    return logp, lse


def _sha256(t):
    return hashlib.sha256(np.ascontiguousarray(t.numpy(), dtype=np.float32).tobytes()).hexdigest()


def _detail(candidate, reference, mask, dtype, token_start=0, targets=None, sharding=None):
    """drift() plus where the worst token is in the batch and who owns its target."""
    d = drift(candidate, reference, mask=mask, dtype=dtype)
    worst = d["worst"]
    d["worst_global_token"] = None if worst is None else token_start + worst["index"]
    d["worst_target_id"] = None
    d["worst_owner_rank"] = None
    if worst is not None and targets is not None:
        tid = int(targets[worst["index"]])
        d["worst_target_id"] = tid
        if sharding is not None and 0 <= tid < sharding.real_vocab_size:
            d["worst_owner_rank"] = sharding.owner_rank(tid)
    return d


def _perturbation(perturb):
    """(rank, delta) from the option, else from DETLOGP_DRIFT_REPORT_PERTURB, else None."""
    if perturb is not None:
        return perturb
    spec = os.environ.get(PERTURB_ENV)
    if not spec:
        return None
    try:
        rank, delta = spec.split(":")
        return int(rank), float(delta)
    except ValueError:
        raise LogprobContractError(f"{PERTURB_ENV} must read RANK:DELTA (e.g. 1:0.5); got "
                                   f"{spec!r}") from None


# --- one rank --------------------------------------------------------------------------------------


def _dispatch(case, rank):
    """This rank's contract and its dispatch (a strict one, like a trainer's)."""
    tp_rank, cp_rank, _ = rank_layout(case.tp, case.cp, rank)
    t0, t1 = token_bounds(case.tokens, case.cp)[cp_rank]
    c = LogprobContract(
        role="train", dtype=case.dtype,
        mask=MaskSpec(t1 - t0, _active(case, t0, t1).tolist(), ignore_index=case.ignore_index),
        sharding=ShardingSpec(tp_rank=tp_rank, tp_world_size=case.tp,
                              vocab_shard_bounds=case.vocab_bounds(),
                              real_vocab_size=case.real_vocab,
                              padded_vocab_size=case.padded_vocab, cp_rank=cp_rank,
                              cp_world_size=case.cp),
        num_vocab_tiles=case.num_vocab_tiles)
    d = Registry.with_builtin_backends().get_logprob_op(c, case.backend)
    # Strict, like a trainer's: no fallback, and the backend asked for by id is the one that runs
    # (every rank dispatches the same contract the same way, so every rank raises together).
    if d.fallback:
        raise RuntimeError(f"dispatch fell back to {d.actual_backend}: "
                           f"{' | '.join(d.prior_rejections)}")
    if case.backend.strip().lower() not in _POLICIES and d.actual_backend != case.backend.strip():
        raise RuntimeError(f"dispatch returned {d.actual_backend}, not the requested "
                           f"{case.backend}")
    return c, d


def _score_rank(case, rank, tp_group, perturb, c, d):
    """This rank's scores, checks and report (everything but the cross-rank aggregate), with
    its contract ``c`` and dispatch ``d``."""
    import torch
    import torch.distributed as dist

    tp_rank, cp_rank, _ = rank_layout(case.tp, case.cp, rank)
    logits, targets, active = _inputs(case)
    t0, t1 = token_bounds(case.tokens, case.cp)[cp_rank]
    bounds = case.vocab_bounds()
    v0, v1 = bounds[tp_rank]
    rows = logits[t0:t1]
    local = rows[:, v0:v1].clone()
    real_local = max(0, min(case.real_vocab - v0, v1 - v0))
    planted = perturb is not None and perturb[0] == rank
    if planted:
        local[:, :real_local] += perturb[1]
    fed = local.to(torch_dtype(case.dtype)).contiguous()
    tg, act = targets[t0:t1], active[t0:t1]
    logp, lse = d.op(fed, tg, contract=c, group=tp_group if case.tp > 1 else None,
                     validate=True)

    # Every TP rank must hold the same bits.
    mine = (logp.numpy().tobytes(), lse.numpy().tobytes())
    if case.tp > 1:
        peers = [None] * case.tp
        dist.all_gather_object(peers, mine, group=tp_group)
    else:
        peers = [mine]
    replicated = all(p == mine for p in peers)

    oracle_logp, oracle_lse = _oracle(rows, tg, act, case.real_vocab)
    dlogp = _detail(logp, oracle_logp, act, case.dtype, t0, tg, c.sharding)
    lse_detail = _detail(lse, oracle_lse, None, case.dtype, t0, tg, c.sharding)
    # The shard this rank fed against the oracle's view of it: localizes a disagreeing rank.
    shard = None
    if real_local > 0:
        fed_lse = torch.logsumexp(fed[:, :real_local].double(), dim=-1)
        ref_lse = torch.logsumexp(rows[:, v0:v0 + real_local].double(), dim=-1)
        shard = _detail(fed_lse, ref_lse, None, case.dtype, t0)

    who = f"rank {rank} (tp_rank {tp_rank}, cp_rank {cp_rank})"
    failures = []
    if not replicated:
        failures.append(f"{who}: TP outputs are not bitwise replicated across its TP group")
    if shard is not None and not shard["passed"]:
        failures.append(f"{who}: its logits shard [{v0}, {v1}) disagrees with the oracle's "
                        f"({'; '.join(shard['failures'])})")
    for name, det in (("dlogp", dlogp), ("lse", lse_detail)):
        if not det["passed"]:
            failures.append(f"{who}: {name} drift vs the float64 oracle: "
                            f"{'; '.join(det['failures'])}")
    report = {
        "global_rank": rank, "tp_rank": tp_rank, "tp_world_size": case.tp, "cp_rank": cp_rank,
        "cp_world_size": case.cp, "sp_world_size": 1, "dp_world_size": 1,
        "token_start": t0, "token_end": t1, "vocab_start": v0, "vocab_end": v1,
        "device": "cpu", "requested_backend": d.requested_backend,
        "actual_backend": d.actual_backend, "fallback": d.fallback,
        "kernel": d.provenance.get("kernel"),
        "contract_fingerprint": c.cross_rank_fingerprint(), "contract": c.to_dict(),
        "capability": d.capability.to_dict(),
        "tp_outputs_bitwise_replicated": replicated,
        "output_sha256": {"logp": _sha256(logp), "lse": _sha256(lse)},
        "dlogp": dlogp, "lse": lse_detail, "shard_lse": shard,
        "perturbed": planted, "failures": failures, "passed": not failures,
    }
    payload = {"cp_rank": cp_rank, "tp_rank": tp_rank, "logp": mine[0], "lse": mine[1]}
    return report, payload


def _aggregate(case, reports, payloads, output):
    """The topology's report from every rank's report and outputs (on global rank 0)."""
    import torch

    logits, targets, active = _inputs(case)
    # The batch in CP order, from each CP shard's TP rank 0.
    firsts = sorted((p for p in payloads if p["tp_rank"] == 0), key=lambda p: p["cp_rank"])
    logp = torch.from_numpy(np.frombuffer(b"".join(p["logp"] for p in firsts),
                                          dtype=np.float32).copy())
    lse = torch.from_numpy(np.frombuffer(b"".join(p["lse"] for p in firsts),
                                         dtype=np.float32).copy())
    oracle_logp, oracle_lse = _oracle(logits, targets, active, case.real_vocab)
    agg = {"dlogp": _detail(logp, oracle_logp, active, case.dtype, 0, targets),
           "lse": _detail(lse, oracle_lse, None, case.dtype, 0, targets)}
    backends = sorted({r["actual_backend"] for r in reports})
    reductions = {json.dumps(r["contract"]["reduction"], sort_keys=True) for r in reports}
    consistent = len(backends) == 1 and len(reductions) == 1
    failures = [f for r in reports for f in r["failures"]]
    if not consistent:
        failures.append(f"ranks disagree on the backend {backends} or the reduction")
    for name, det in agg.items():
        if not det["passed"]:
            failures.append(f"aggregate {name} drift over the batch: "
                            f"{'; '.join(det['failures'])}")
    return {
        "schema_version": SCHEMA_VERSION,
        "case_id": case.case_id,
        "case": case.to_dict(),
        "launch_command": launch_command(case, output or "report.json"),
        "environment": {
            "python": _platform.python_version(), "torch": torch.__version__,
            "detlogp": _detlogp.version(), "numerics_version": _detlogp.NUMERICS_VERSION,
            "dist_backend": "gloo", "world_size": case.world_size,
            "sp_world_size": 1, "dp_world_size": 1,
            "materialization": {"actual_backends": backends, "consistent": consistent},
            "communication": {"logprob_merge_axis": "tp_vocab", "cp_is_merge_axis": False,
                              "report_collection": "all_gather_object"},
        },
        "ranks": sorted(reports, key=lambda r: r["global_rank"]),
        "aggregate": agg,
        "bitwise_fingerprints": {"candidate_logp_sha256": _sha256(logp),
                                 "candidate_lse_sha256": _sha256(lse), "dtype": "float32",
                                 "shape": [case.tokens]},
        "failed_ranks": [r["global_rank"] for r in reports if not r["passed"]],
        "disagreeing_shard_ranks": [r["global_rank"] for r in reports
                                    if r["shard_lse"] is not None
                                    and not r["shard_lse"]["passed"]],
        "failures": failures,
        "passed": consistent and not failures,
    }


def _write_json(obj, path, out=None):
    """Indent 2, sorted keys, NaN and infinities refused, trailing newline; to stdout (path
    None) or atomically (_atomic_file: a temporary file no one can plant a link at, fsync,
    rename), through ``out`` when the output was opened up front, so a failure never leaves a
    partial report."""
    text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"
    if path is None:
        sys.stdout.write(text)
        return
    with out if out is not None else AtomicOutputFile(path) as f:
        f.write(text.encode())
        f.commit()


def _world_from_env():
    """(rank, world size) as torchrun or mpirun set them, or None outside a launcher."""
    for rank_var, size_var in (("RANK", "WORLD_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return None


def _agreed_options(case, perturb):
    """The options every rank must share, as "--name value" items (one per option)."""
    items = [f"--{f.name.replace('_', '-')} {getattr(case, f.name)}"
             for f in dataclasses.fields(case)]
    items.append("--perturb-rank (none)" if perturb is None else
                 f"--perturb-rank {perturb[0]} --perturb-delta {perturb[1]!r}")
    return items


def _preflight(case, rank, world, output):
    """Everything this rank can check before the computation: the memory its machine needs,
    the dispatch of its contract and, on global rank 0, the output file (created now, so an
    output that cannot be written is refused before any work). Returns (contract, dispatch,
    output file or None)."""
    _check_memory(case, rank, world)
    c, d = _dispatch(case, rank)
    out = AtomicOutputFile(output) if rank == 0 and output is not None else None
    return c, d, out


def _agree(case, rank, world, perturb, output):
    """Every rank runs its preflight, then all of them exchange their verdicts and options in
    one small all-gather, before any other group or collective: either every rank goes on, or
    every rank raises the same error -- two ranks' first differing option ("rank 0 has --tp 2
    but rank 1 has --tp 1"), else the first failing rank's error. Returns the preflight's
    result."""
    import torch.distributed as dist

    mine, result = None, None
    try:
        result = _preflight(case, rank, world, output)
    except Exception as e:  # every failure must reach the peers, whatever its type
        kind = "contract" if isinstance(e, LogprobContractError) else "runtime"
        text = str(e) if isinstance(e, (LogprobContractError, RuntimeError)) else \
            f"{type(e).__name__}: {e}"
        mine = (kind, text)
    records = [None] * world
    dist.all_gather_object(records, (_agreed_options(case, perturb), mine))
    try:
        first = records[0][0]
        for r in range(1, world):
            for a, b in zip(first, records[r][0]):
                if a != b:
                    raise LogprobContractError(
                        f"the ranks disagree on their options: rank 0 has {a} but rank {r} has "
                        f"{b}; launch every rank with the same options")
        for r, (_, failure) in enumerate(records):
            if failure is not None:
                kind, text = failure
                text = text if r == 0 else f"rank {r}: {text}"
                raise (LogprobContractError if kind == "contract" else RuntimeError)(text)
    except BaseException:
        if result is not None and result[2] is not None:
            result[2].discard()
        raise
    return result


def run_topology(case, output=None, init_method="env://", perturb=None):
    """Runs one topology on this process's rank (under torchrun or mpirun); global rank 0
    writes the report. Returns the report's ``passed`` on every rank.

    Raises LogprobContractError for a bad case or options that differ between ranks, and
    RuntimeError for the environment (a world size that is not TP*CP, memory that does not
    suffice, an output that cannot be written, a failed process group), on every rank alike
    once the process group exists."""
    import torch.distributed as dist

    env = _world_from_env()
    rank, world = env if env is not None else (0, 1)
    # Checked before any process group exists: a wrong launch never reaches a collective.
    if world != case.world_size:
        raise RuntimeError(
            f"WORLD_SIZE={world} does not match TP*CP={case.tp}*{case.cp}={case.world_size}; "
            f"launch {case.world_size} processes (or pass the --tp and --cp of this launch)")
    if dist.is_initialized():
        raise RuntimeError("a default process group already exists in this process; the drift "
                           "report creates and destroys its own: run it in a process of its own")
    perturb = _perturbation(perturb)
    if perturb is not None and not 0 <= perturb[0] < world:
        raise LogprobContractError(f"perturb rank {perturb[0]} is outside [0, {world})")
    if perturb is not None and not math.isfinite(perturb[1]):
        raise LogprobContractError(f"the perturbation delta must be finite; got {perturb[1]!r}")
    if init_method == "env://":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
    out = None
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                                timeout=_PROCESS_GROUP_TIMEOUT)
        c, d, out = _agree(case, rank, world, perturb, output)
        # Every rank creates every TP group, in the same order (torch.distributed requires it).
        groups = [dist.new_group(list(rank_layout(case.tp, case.cp, cp * case.tp)[2]))
                  for cp in range(case.cp)] if case.tp > 1 else [None] * case.cp
        _, cp_rank, _ = rank_layout(case.tp, case.cp, rank)
        report, payload = _score_rank(case, rank, groups[cp_rank], perturb, c, d)
        gathered = [None] * world
        dist.all_gather_object(gathered, (report, payload))
        full = _aggregate(case, [g[0] for g in gathered], [g[1] for g in gathered], output)
        if rank == 0:
            _write_json(full, output, out)
        return full["passed"]
    finally:
        if out is not None:
            out.discard()
        # Whatever exists now is the report's own (one that existed before was refused above),
        # also when init_process_group failed after making the default group (its closing
        # barrier): destroyed on every path.
        if dist.is_initialized():
            dist.destroy_process_group()


# --- all topologies --------------------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _package_env(extra=None):
    """The environment of a worker process: this package importable from where this process
    found it, one kernel thread per process (the ranks share the machine)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def spawn_local(case, output, perturb=None, timeout_s=600):
    """Runs one topology as case.world_size local processes with the environment torchrun
    gives its workers (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT). Like torchrun, it stops the other ranks when one ends with an error (exit
    status 2 or a signal; they get a few seconds to end on their own first, as ranks that
    fail together do). Returns (exit code: the worst rank's, not counting the ranks it stopped,
    [each rank's stderr])."""
    import tempfile
    import time

    port = _free_port()
    argv = [sys.executable, "-m", "detlogp.drift_report"] + _case_args(case) + [
        "--output", str(output)]
    if perturb is not None:
        argv += ["--perturb-rank", str(perturb[0]), "--perturb-delta", repr(perturb[1])]
    procs, logs = [], []
    for r in range(case.world_size):
        env = _package_env({"RANK": str(r), "LOCAL_RANK": str(r),
                            "WORLD_SIZE": str(case.world_size), "LOCAL_WORLD_SIZE":
                            str(case.world_size), "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(port)})
        logs.append(tempfile.TemporaryFile(mode="w+"))
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                      stderr=logs[-1], text=True))
    deadline = time.monotonic() + timeout_s
    failed_at, notes = None, [""] * len(procs)
    while [p.poll() for p in procs].count(None):  # polls every rank
        now = time.monotonic()
        if failed_at is None and any(p.returncode not in (None, 0, 1) for p in procs):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + _PEER_GRACE_S):
            for i, p in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    p.wait()
                    notes[i] = (f"\ntimed out after {timeout_s} s" if now > deadline else
                                "\nstopped by the launcher: another rank failed")
            break
        time.sleep(0.05)
    errs = []
    for log, note in zip(logs, notes):
        log.seek(0)
        errs.append(log.read() + note)
        log.close()
    # A rank the launcher stopped says nothing of its own: the failing rank's code counts.
    codes = [p.returncode for p, note in zip(procs, notes) if "stopped" not in note]
    return max(codes, key=lambda c: (c != 0, abs(c))), errs


def launch(template, output_dir, topologies=PLANNED_TOPOLOGIES, launcher="local",
           timeout_s=600):
    """Runs every topology, one after the other, and writes output_dir/summary.json. Returns
    whether every topology passed and all of them produced the same output bits.

    ``launcher``: "local" (spawn_local), "torchrun" (the plan's commands) or "mpirun"
    (mpirun --oversubscribe -np W, MASTER_ADDR/MASTER_PORT passed with -x)."""
    if launcher not in ("local", "torchrun", "mpirun"):
        raise LogprobContractError(f"launcher must be local, torchrun or mpirun; got "
                                   f"{launcher!r}")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise RuntimeError(f"{output_dir}: cannot create the output directory: "
                           f"{e.strerror}") from None
    # Opened up front: a summary that cannot be written is refused before any topology runs.
    with AtomicOutputFile(os.path.join(str(output_dir), "summary.json")) as out:
        return _launch(template, output_dir, topologies, launcher, timeout_s, out)


def _launch(template, output_dir, topologies, launcher, timeout_s, out):
    entries = []
    for case, path, _ in plan(template, output_dir, topologies):
        if os.path.exists(path):
            os.remove(path)
        if launcher == "local":
            code, errs = spawn_local(case, path, timeout_s=timeout_s)
            err = "".join(errs)
        else:
            port = _free_port()
            if launcher == "torchrun":
                argv = launch_argv(case, path, port)
            else:
                argv = ["mpirun", "--oversubscribe", "-np", str(case.world_size), "-x",
                        "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR=127.0.0.1",
                        "-x", f"MASTER_PORT={port}", sys.executable, "-m",
                        "detlogp.drift_report"] + _case_args(case) + ["--output", path]
                if os.geteuid() == 0:
                    argv.insert(1, "--allow-run-as-root")
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  env=_package_env())
            code, err = proc.returncode, proc.stderr
        entry = {"tp": case.tp, "cp": case.cp, "world_size": case.world_size, "report": path,
                 "exit_code": code, "passed": False,
                 "candidate_logp_sha256": None, "candidate_lse_sha256": None}
        if os.path.exists(path):
            with open(path) as f:
                rep = json.load(f)
            entry["passed"] = bool(rep["passed"]) and code == 0
            entry["candidate_logp_sha256"] = rep["bitwise_fingerprints"]["candidate_logp_sha256"]
            entry["candidate_lse_sha256"] = rep["bitwise_fingerprints"]["candidate_lse_sha256"]
            entry["failures"] = rep["failures"]
        else:
            entry["failures"] = [f"no report (exit {code}): {err[-2000:]}"]
        entries.append(entry)
    hashes = {(e["candidate_logp_sha256"], e["candidate_lse_sha256"]) for e in entries}
    cross = len(hashes) == 1 and None not in next(iter(hashes))
    summary = {"schema_version": SCHEMA_VERSION,
               "case": {k: v for k, v in template.to_dict().items() if k not in ("tp", "cp")},
               "topologies": entries, "cross_topology_bitwise": cross,
               "passed": cross and all(e["passed"] for e in entries)}
    _write_json(summary, out.path, out)
    return summary["passed"]


def _topologies(text):
    out = []
    for item in text.split(","):
        try:
            tp, cp = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise LogprobContractError(f"--topologies takes TPxCP items like 2x2; got {item!r}")
        out.append((tp, cp))
    return tuple(out)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """A bad option: one line, exit 2 (the usage is in --help)."""
        self.exit(2, f"detlogp.drift_report: error: {message} (see python -m "
                     "detlogp.drift_report --help)\n")


def _parser():
    p = _Parser(prog="python -m detlogp.drift_report", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--backend", default=_detlogp.CPU_CANONICAL_BACKEND_ID,
                   help="explicit backend id (or production/reference); never auto")
    p.add_argument("--real-vocab", type=int, default=151936)
    p.add_argument("--padded-vocab", type=int, default=151936)
    p.add_argument("--num-vocab-tiles", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=8)
    p.add_argument("--batch-key", type=int, default=123)
    p.add_argument("--ignore-index", type=int, default=-100)
    p.add_argument("--logit-scale", type=float, default=2.0)
    p.add_argument("--device", default="cpu", choices=("cpu",))
    p.add_argument("--dist-backend", default="gloo", choices=("gloo",))
    p.add_argument("--init-method", default="env://",
                   help="torch.distributed init method (env:// under torchrun; file:///path "
                        "for mpirun without MASTER_ADDR/MASTER_PORT)")
    p.add_argument("--output", help="report file (global rank 0 writes it); default stdout")
    p.add_argument("--plan", action="store_true", help="print the planned commands as JSON")
    p.add_argument("--launch", action="store_true", help="run every planned topology")
    p.add_argument("--launcher", default="local", choices=("local", "torchrun", "mpirun"),
                   help="how --launch starts each topology's processes")
    p.add_argument("--output-dir", default=".", help="where --plan/--launch put the reports")
    p.add_argument("--topologies", type=_topologies, default=PLANNED_TOPOLOGIES,
                   help="comma-separated TPxCP list for --plan/--launch (default: the plan)")
    p.add_argument("--perturb-rank", type=int, help="testing: perturb this global rank's logits")
    p.add_argument("--perturb-delta", type=float, default=1.0,
                   help="testing: what --perturb-rank adds to its real-vocabulary logits")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        case = DriftCase(tp=args.tp, cp=args.cp, dtype=args.dtype, backend=args.backend,
                         real_vocab=args.real_vocab, padded_vocab=args.padded_vocab,
                         num_vocab_tiles=args.num_vocab_tiles, batch=args.batch, seq=args.seq,
                         prompt_tokens=args.prompt_tokens, batch_key=args.batch_key,
                         ignore_index=args.ignore_index, logit_scale=args.logit_scale)
        if args.plan:
            cmds = [cmd for _, _, cmd in plan(case, args.output_dir, args.topologies)]
            print(json.dumps({"commands": cmds}, indent=2))
            return 0
        if args.launch:
            return 0 if launch(case, args.output_dir, args.topologies, args.launcher) else 1
        perturb = None if args.perturb_rank is None else (args.perturb_rank, args.perturb_delta)
        passed = run_topology(case, args.output, args.init_method, perturb)
    except (LogprobContractError, RuntimeError) as e:
        # A bad case or launch, or the environment: one line, on every rank alike.
        print(f"detlogp.drift_report: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if not passed:
        print(f"detlogp.drift_report: FAIL (tp={case.tp}, cp={case.cp}); see "
              f"{args.output or 'the report'}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
