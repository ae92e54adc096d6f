#!/usr/bin/env python3
"""PyTorch baseline for docs/benchmarks.md, on the same shape as bench_kernels.

forward:  torch.log_softmax(x.float(), -1).gather(1, target)   (what RL trainers do today)
backward: autograd of that logp (sum) back to x, x.grad in x's dtype.
Median of --reps timed runs after a warm-up, torch.set_num_threads(--threads). One JSON object
per line in --json.
"""
import json
import statistics
import time

import torch

from bench_args import int_options

REAL_VOCAB = 151936
PADDED = 152064


def median_seconds(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = int_options(rows=1024, threads=2, reps=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = []
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        x = (torch.randn(args.rows, PADDED) * 3.0).to(dtype)
        target = torch.randint(0, REAL_VOCAB, (args.rows, 1))

        def forward():
            with torch.no_grad():
                return torch.log_softmax(x.float(), -1).gather(1, target)

        fwd = median_seconds(forward, args.reps)

        xg = x.clone().requires_grad_(True)
        state = {}

        def prepare():
            xg.grad = None
            state["logp"] = torch.log_softmax(xg.float(), -1).gather(1, target)

        def backward():
            state["logp"].sum().backward()

        # Time the backward alone (the forward graph is rebuilt before each run, untimed).
        prepare()
        backward()
        times = []
        for _ in range(args.reps):
            prepare()
            t0 = time.perf_counter()
            backward()
            times.append(time.perf_counter() - t0)
        bwd = statistics.median(times)
        elems = args.rows * PADDED
        for op, sec in (("forward", fwd), ("backward", bwd)):
            r = {"kind": "torch", "op": op, "dtype": dtype_name, "rows": args.rows,
                 "cols": PADDED, "threads": args.threads, "seconds": sec,
                 "elements_per_s": elems / sec, "torch": torch.__version__}
            results.append(r)
            print(f"torch      {op:<16} {dtype_name:<5} rows {args.rows:5d}  {sec * 1e3:9.2f} ms"
                  f"  {elems / sec / 1e9:6.2f} G elem/s", flush=True)
        del x, xg, state
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
