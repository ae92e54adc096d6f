#!/usr/bin/env python3
"""detlogp.torch benchmark for docs/benchmarks.md ("The functional torch API").

For TP=1 and TP=2 (gloo, spawned ranks, --threads per rank), bf16 and fp32, --rows tokens of
Qwen3's vocabulary (real 151936, Megatron-padded): the minimum (and, as <name>_median, the
median) seconds over --reps rounds that alternate the cases being compared, of
  op_fwd        the contract API (prebuilt contract, op.forward): the C++ operator
  fn_fwd        detlogp.torch.vocab_parallel_logprobs on the same 2-D logits, no grad
  fn_fwd_shift  the same on the causal shift logits[:, :-1] of [2, rows/2 + 1, V] (in place)
  bwd_fresh     backward of one forward into a fresh gradient tensor (torch.empty each time)
  bwd_fresh_hugepage  the same into a fresh mapping advised MADV_HUGEPAGE
  bwd_reused    the same into one reused gradient tensor
  bwd_pooled    the same with out=None: the pooled gradient buffer
  fn_bwd        the functional API's autograd backward alone (forward untimed)
  fn_fwd_bwd    functional forward + autograd backward (steady loop: pooled gradient)
  megatron      forward + backward of a faithful PyTorch re-implementation of Megatron's
                vocab_parallel_cross_entropy (fp32 logits, all-reduce max / sum, its backward)
and at --overhead-rows tokens x 1024 columns the per-call overhead of the functional API over
op.forward (same inputs), with the contract cached: as the difference of the two calls and as
the time of the functional API's own preparation alone (fn_prepare: targets, mask, cover,
cached contract and dispatch; no collective, so no gloo jitter), the cost of building a
contract per call the old way (MaskSpec from a Python list), and the cache's counters
(contract hits, gradient buffer reuses). One JSON object per line on stdout.
"""

import datetime
import json
import mmap
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench_args import int_options

REAL = 151936


def interleaved(cases, reps, sync=None):
    """Times every case once per round, rounds alternating the cases, so that load drifting
    on a shared machine hits every case alike. ``cases``: name -> fn or (fn, setup); setup is
    untimed. Returns name -> (min, median) seconds after one warm-up round."""
    times = {name: [] for name in cases}
    for round_ in range(reps + 1):
        for name, case in cases.items():
            fn, setup = case if isinstance(case, tuple) else (case, None)
            if setup:
                setup()
            if sync:
                sync()
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
            if round_:
                times[name].append(t)
    return {name: (min(ts), statistics.median(ts)) for name, ts in times.items()}


def record(r, timings):
    for name, (best, med) in timings.items():
        r[name] = best
        r[name + "_median"] = med


class MegatronCrossEntropy(torch.autograd.Function):
    """Megatron-LM's _VocabParallelCrossEntropy (label_smoothing=0), in plain PyTorch."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target, group):
        logits = vocab_parallel_logits.float()
        logits_max = torch.max(logits, dim=-1)[0]
        if group is not None:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        logits = logits - logits_max.unsqueeze(dim=-1)
        rank = dist.get_rank(group) if group is not None else 0
        width = logits.size(-1)
        start, end = rank * width, (rank + 1) * width
        target_mask = (target < start) | (target >= end)
        masked_target = target.clone() - start
        masked_target[target_mask] = 0
        logits_2d = logits.view(-1, width)
        arange_1d = torch.arange(0, logits_2d.size(0))
        predicted = logits_2d[arange_1d, masked_target.view(-1)].clone().view_as(target)
        predicted[target_mask] = 0.0
        if group is not None:
            dist.all_reduce(predicted, op=dist.ReduceOp.SUM, group=group)
        exp_logits = logits
        torch.exp(logits, out=exp_logits)
        sum_exp = exp_logits.sum(dim=-1)
        if group is not None:
            dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
        loss = torch.log(sum_exp) - predicted
        exp_logits.div_(sum_exp.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target_mask, masked_target)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target = ctx.saved_tensors
        grad_input = softmax
        grad_2d = grad_input.view(-1, grad_input.size(-1))
        arange_1d = torch.arange(0, grad_2d.size(0))
        grad_2d[arange_1d, masked_target.view(-1)] -= 1.0 - target_mask.view(-1).float()
        grad_input.mul_(grad_output.unsqueeze(dim=-1))
        return grad_input, None, None


def hugepage_like(x):
    """A fresh anonymous mapping advised MADV_HUGEPAGE (2 MiB pages where the kernel has
    them: 512x fewer faults), as an uninitialized tensor like x."""
    m = mmap.mmap(-1, x.numel() * x.element_size())
    m.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(m, dtype=x.dtype).view(x.shape)


def bench_rank(rank, tp, args, init_file, out_file):
    import detlogp
    import detlogp.torch as dt

    torch.set_num_threads(args.threads)
    group = None
    if tp > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=tp, timeout=datetime.timedelta(seconds=600))
        group = dist.group.WORLD
    sync = dist.barrier if tp > 1 else None
    padded, bounds = detlogp.megatron_bounds(REAL, tp)
    s, e = bounds[rank]
    lines = []
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        g = torch.Generator().manual_seed(0)
        n = args.rows
        targets = torch.randint(0, REAL, (n,), generator=g)
        x = (torch.randn(n, e - s, generator=g) * 3).to(dtype)
        gl = torch.randn(n, generator=g)
        sharding = detlogp.ShardingSpec(tp_rank=rank, tp_world_size=tp,
                                        vocab_shard_bounds=bounds, real_vocab_size=REAL,
                                        padded_vocab_size=padded)
        contract = detlogp.LogprobContract(role="train", dtype=dtype_name,
                                           mask=detlogp.MaskSpec.all_active(n),
                                           sharding=sharding)
        op = detlogp.get_logprob_op(contract).op
        comm = detlogp.TorchDistributedComm(group) if tp > 1 else None
        r = {"tp": tp, "dtype": dtype_name, "rows": n, "threads_per_rank": args.threads,
             "kernel": op.kernel_name}
        tnp = targets.numpy()
        half = n // 2
        x3 = (torch.randn(2, half + 1, e - s, generator=g) * 3).to(dtype)
        t3 = torch.randint(0, REAL, (2, half + 1), generator=g)
        record(r, interleaved({
            "op_fwd": lambda: op.forward(x, tnp, contract=contract, group=comm,
                                         threads=args.threads),
            "fn_fwd": lambda: dt.vocab_parallel_logprobs(x, targets, group=group,
                                                         real_vocab=REAL),
            "fn_fwd_shift": lambda: dt.vocab_parallel_logprobs(x3[:, :-1], t3[:, 1:],
                                                               group=group, real_vocab=REAL),
        }, args.reps, sync))
        del x3
        f = op.forward(x, tnp, contract=contract, group=comm, threads=args.threads)
        buf = torch.empty_like(x)
        leaf = x.clone().requires_grad_()
        state = {}

        def fn_forward():
            leaf.grad = None
            state["logp"] = dt.vocab_parallel_logprobs(leaf, targets, group=group,
                                                       real_vocab=REAL)

        record(r, interleaved({
            "bwd_fresh": lambda: f.backward(grad_logp=gl, out=torch.empty_like(x)),
            "bwd_fresh_hugepage": lambda: f.backward(grad_logp=gl, out=hugepage_like(x)),
            "bwd_reused": lambda: f.backward(grad_logp=gl, out=buf),
            "bwd_pooled": lambda: f.backward(grad_logp=gl),
            "fn_bwd": (lambda: state["logp"].backward(gl), fn_forward),
        }, args.reps, sync))
        state.clear()
        del f, buf

        def fn_step():
            leaf.grad = None
            dt.vocab_parallel_logprobs(leaf, targets, group=group, real_vocab=REAL).backward(gl)

        t2 = targets.clone()

        def meg_step():
            leaf.grad = None
            MegatronCrossEntropy.apply(leaf, t2, group).backward(gl)

        cases = {"fn_fwd_bwd": fn_step}
        if not args.skip_megatron:
            cases["megatron"] = meg_step
        record(r, interleaved(cases, args.reps, sync))
        if not args.skip_megatron:
            r["speedup_vs_megatron"] = r["megatron"] / r["fn_fwd_bwd"]
        leaf.grad = None
        del leaf
        r["fn_fwd_over_op"] = r["fn_fwd"] / r["op_fwd"]
        r["fn_fwd_shift_over_op"] = r["fn_fwd_shift"] / r["op_fwd"]
        r["bwd_fresh_over_reused"] = r["bwd_fresh"] / r["bwd_reused"]
        r["bwd_fresh_hugepage_over_reused"] = r["bwd_fresh_hugepage"] / r["bwd_reused"]
        r["bwd_pooled_over_reused"] = r["bwd_pooled"] / r["bwd_reused"]
        r["fn_bwd_over_reused"] = r["fn_bwd"] / r["bwd_reused"]
        lines.append(r)

    # Per-call overhead at --overhead-rows tokens: tiny vocab so the kernels cost little.
    n, v = args.overhead_rows, 1024
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, v, generator=g)
    targets = torch.randint(0, v * tp, (n,), generator=g)
    targets[:: 7] = -100
    ob = [(k * v, (k + 1) * v) for k in range(tp)]
    keep = (targets != -100).tolist()
    sharding = detlogp.ShardingSpec(tp_rank=rank, tp_world_size=tp, vocab_shard_bounds=ob,
                                    real_vocab_size=v * tp, padded_vocab_size=v * tp)

    def build_contract():
        return detlogp.LogprobContract(role="train", dtype="fp32",
                                       mask=detlogp.MaskSpec(n, keep), sharding=sharding)

    c = build_contract()
    op = detlogp.get_logprob_op(c).op
    comm = detlogp.TorchDistributedComm(group) if tp > 1 else None
    tnp = targets.numpy()
    reps = max(args.reps, 50)
    o = {"tp": tp, "overhead_rows": n, "overhead_cols": v}
    keep_t = torch.tensor(keep)
    cache = dt.DEFAULT_CACHE
    fn_comm = cache.communicator(group)

    def prepare():  # what the functional API adds before the operator runs
        return dt._prepare(x, targets, fn_comm, cache, real_vocab=None, loss_mask=None,
                           ignore_index=-100, temperature=1.0, deterministic=True,
                           vocab_start=None, threads=args.threads, tile_width=None)

    record(o, interleaved({
        "op_fwd": lambda: op.forward(x, tnp, contract=c, group=comm, threads=args.threads),
        "fn_fwd": lambda: dt.vocab_parallel_logprobs(x, targets, group=group),
        "fn_prepare": prepare,
        "op_fwd_new_contract": lambda: op.forward(x, tnp, contract=build_contract(),
                                                  group=comm, threads=args.threads),
    }, reps, sync))
    o["overhead_ms"] = 1e3 * (o["fn_fwd"] - o["op_fwd"])
    o["overhead_ms_median"] = 1e3 * (o["fn_fwd_median"] - o["op_fwd_median"])
    o["fn_prepare_ms"] = 1e3 * o["fn_prepare"]
    o["cache_stats"] = dict(dt.DEFAULT_CACHE.stats)
    record(o, interleaved({"contract_from_list": build_contract,
                           "mask_spec_from_bool_tensor": lambda: detlogp.MaskSpec(n, keep_t)},
                          reps))
    lines.append(o)
    if tp > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        with open(out_file, "w") as fh:
            for line in lines:
                fh.write(json.dumps(line) + "\n")


def main():
    ap = int_options(rows=1024, threads=1, reps=5, overhead_rows=8192)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--skip-megatron", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for tp in args.tp:
            out = os.path.join(tmp, f"tp{tp}.jsonl")
            init = os.path.join(tmp, f"init{tp}")
            if tp == 1:
                bench_rank(0, 1, args, init, out)
            else:
                mp.spawn(bench_rank, args=(tp, args, init, out), nprocs=tp)
            sys.stdout.write(open(out).read())
            sys.stdout.flush()


if __name__ == "__main__":
    main()
