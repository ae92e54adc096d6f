#!/usr/bin/env python3
"""The cost of the Python package's hardening checks on the hot path (docs/benchmarks.md,
"Hardening checks"), at TP=2 over gloo (two spawned ranks, --threads each).

Each case runs with the checks on (the package as it is) and off (the checks patched out in
this process: the per-group call guard, the overlap byte on every gather, the storage stamps
of backward), in alternating rounds so that load drifting on a shared machine hits both
alike. The minimum and median seconds over --reps rounds, per case and mode:
  fn_fwd      detlogp.torch.vocab_parallel_logprobs, no grad ([rows, V/2] logits, Qwen3's V)
  fn_fwd_bwd  the same with autograd: forward + backward
  fused       fused_linear_logprobs forward + backward ([--fused-rows, H] hidden, [8192, H]
              weight shard)
  small_fwd   fn_fwd on [--small-rows, 1024]: the per-call overhead where the kernels are cheap
On a loaded machine the end-to-end differences drown in noise, so each check is also timed
alone, in one process (microseconds of CPU time per call, the minimum of 7 runs of a loop):
  stamp       the storage stamp at forward and its check at backward (one tensor)
  guard       entering and leaving the per-group call guard (a context manager, no contention)
  gather_<n>  the Python side of one all-gather of n bytes per rank at TP=2 (the collective
              itself replaced by a copy), with the overlap byte minus without it
One JSON object per line on stdout (rank 0 for the end-to-end cases).
"""

import contextlib
import datetime
import json
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


def _gather_without_overlap_byte(self, send):
    """The transport's all_gather before the overlap byte (CPU tensors): for the "off" mode."""
    n = len(send)
    if n == 0:
        outs = [torch.empty(1, dtype=torch.uint8) for _ in range(self.size)]
        work = dist.all_gather(outs, torch.zeros(1, dtype=torch.uint8), group=self.group_ref(),
                               async_op=True)
        self._wait(work, "all_gather")
        return b""
    recv = torch.empty(self.size * n, dtype=torch.uint8)
    outs = list(recv.split(n))
    work = dist.all_gather(outs, torch.frombuffer(bytearray(send), dtype=torch.uint8),
                           group=self.group_ref(), async_op=True)
    self._wait(work, "all_gather")
    return recv.numpy().tobytes()


def _switch(on):
    """Patches the checks out (on=False) or back in, in this process."""
    import detlogp._call as dcall
    import detlogp._comm as dcomm
    import detlogp._fused as dfused
    import detlogp._storage as dstorage

    saved = _switch.saved
    if not saved:
        saved.update(gather=dcomm._Callbacks.all_gather, exclusive=dcall.exclusive,
                     stamp=dstorage.stamp)
    if on:
        dcomm._Callbacks.all_gather = saved["gather"]
        dcall.exclusive = dfused.exclusive = saved["exclusive"]
        dcall.stamp = dfused.stamp = saved["stamp"]
    else:
        dcomm._Callbacks.all_gather = _gather_without_overlap_byte
        dcall.exclusive = dfused.exclusive = lambda comm: contextlib.nullcontext()
        dcall.stamp = dfused.stamp = lambda x: None


_switch.saved = {}


def _cases(rank, args):
    import detlogp
    import detlogp.torch as dt

    group = dist.group.WORLD
    padded, bounds = detlogp.megatron_bounds(REAL, 2)
    start, end = bounds[rank]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(args.rows, end - start, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, REAL, (args.rows,), generator=g)
    leaf = logits.clone().requires_grad_()
    small = torch.randn(args.small_rows, 1024, generator=g)
    small_ids = torch.randint(0, 2048, (args.small_rows,), generator=g)
    hidden = torch.randn(args.fused_rows, args.hidden, generator=g).requires_grad_()
    weight = (torch.randn(8192, args.hidden, generator=g) * 0.05).requires_grad_()
    fused_ids = torch.randint(0, 2 * 8192, (args.fused_rows,), generator=g)

    def fn_fwd():
        with torch.no_grad():
            dt.vocab_parallel_logprobs(logits, ids, group=group, real_vocab=REAL)

    def fn_fwd_bwd():
        leaf.grad = None
        dt.vocab_parallel_logprobs(leaf, ids, group=group, real_vocab=REAL).sum().backward()

    def fused():
        hidden.grad = weight.grad = None
        logp, lse = detlogp.fused_linear_logprobs(hidden, weight, fused_ids, group=group)
        logp.sum().backward()

    def small_fwd():
        with torch.no_grad():
            dt.vocab_parallel_logprobs(small, small_ids, group=group)

    return {"fn_fwd": fn_fwd, "fn_fwd_bwd": fn_fwd_bwd, "fused": fused, "small_fwd": small_fwd}


def _worker(rank, init_file, args):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=600))
    cases = _cases(rank, args)
    times = {(name, mode): [] for name in cases for mode in ("on", "off")}
    for round_ in range(args.reps + 1):
        for name, fn in cases.items():
            for mode in (("on", "off") if round_ % 2 else ("off", "on")):
                _switch(mode == "on")
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                t = time.perf_counter() - t0
                if round_:
                    times[(name, mode)].append(t)
    _switch(True)
    if rank == 0:
        for name in cases:
            on, off = times[(name, "on")], times[(name, "off")]
            print(json.dumps({"case": name, "rows": args.rows, "threads": args.threads,
                              "on_min": min(on), "off_min": min(off),
                              "on_median": statistics.median(on),
                              "off_median": statistics.median(off),
                              "delta_median_us": 1e6 * (statistics.median(on)
                                                        - statistics.median(off))}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _per_call_us(fn, loops, other=None):
    """Microseconds of this thread's CPU time per call of fn (the minimum over 7 runs of
    ``loops`` calls; CPU time, which other processes on the machine barely disturb); with
    ``other``, of both, runs alternating."""
    best = [float("inf"), float("inf")]
    for _ in range(7):
        for k, f in enumerate((fn, other) if other else (fn,)):
            t0 = time.thread_time()
            for _ in range(loops):
                f()
            best[k] = min(best[k], (time.thread_time() - t0) / loops)
    return (best[0] * 1e6, best[1] * 1e6) if other else best[0] * 1e6


def _micro():
    """Each check alone (see the module docstring)."""
    import detlogp._comm as dcomm
    from detlogp._storage import check_stamp, stamp

    x = torch.randn(256, 1024)
    print(json.dumps({"check": "stamp", "us": _per_call_us(
        lambda: check_stamp(x, stamp(x), "the logits"), 20000)}), flush=True)

    class GuardedComm(dcomm._detlogp.CallbackComm):
        guard = dcomm._CallGuard()  # what a TorchDistributedComm carries

    comm = GuardedComm(0, 2, "bench", lambda *a: None, lambda: None)

    def guarded():
        with dcomm.exclusive(comm):
            pass

    print(json.dumps({"check": "guard", "us": _per_call_us(guarded, 20000)}), flush=True)

    class Done:
        def wait(self, timeout=None):
            return True

    def copy_gather(outs, send, group=None, async_op=False):
        for o in outs:
            o.copy_(send)
        return Done()

    dist.all_gather = copy_gather
    cb = dcomm._Callbacks(lambda: "the faked gather takes no group", 0, 2, "bench", 60.0, None,
                         dcomm._CallGuard())
    for n in (512, 65536):
        send = bytes(n)
        on, off = _per_call_us(lambda: dcomm._Callbacks.all_gather(cb, send), 2000,
                               lambda: _gather_without_overlap_byte(cb, send))
        print(json.dumps({"check": f"gather_{n}", "with_us": on, "without_us": off,
                          "extra_us": on - off}), flush=True)


def main():
    parser = int_options(__doc__.split("\n")[0], rows=256, small_rows=64, fused_rows=64,
                         hidden=256, threads=1, reps=20)
    parser.add_argument("--micro-only", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _micro()
    if args.micro_only:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "rendezvous"), args), nprocs=2)


if __name__ == "__main__":
    sys.exit(main())
