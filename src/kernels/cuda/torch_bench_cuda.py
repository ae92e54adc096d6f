#!/usr/bin/env python3
"""PyTorch on the same GPU, same shapes as bench_cuda (docs/cuda.md): the usual selected-token
logprob `torch.log_softmax(x.float(), -1).gather(-1, t)` and its backward, bf16 and fp32 logits.
Times with CUDA events: one warm-up, then the median of --reps runs. Prints a table and, with
--json, one JSON object per case. Exits 0 with a SKIPPED line where torch or CUDA is missing."""
import argparse
import json
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"torch_bench_cuda: SKIPPED: no torch ({e})")
        return 0
    if not torch.cuda.is_available():
        print("torch_bench_cuda: SKIPPED: torch sees no CUDA device")
        return 0
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    targets = torch.randint(0, args.vocab, (args.rows, 1), device=dev, generator=g)
    results = []

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(args.reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        x = (torch.randn(args.rows, args.vocab, device=dev, generator=g) * 3).to(dtype)

        def fwd():
            with torch.no_grad():
                return torch.log_softmax(x.float(), -1).gather(-1, targets)

        results.append({"case": f"torch_forward_{name}", "ms": timed(fwd)})
        xr = x.detach().requires_grad_(True)

        def fwd_bwd():
            xr.grad = None
            logp = torch.log_softmax(xr.float(), -1).gather(-1, targets)
            logp.sum().backward()

        t_fb = timed(fwd_bwd)
        results.append({"case": f"torch_forward_backward_{name}", "ms": t_fb})
        results.append({"case": f"torch_backward_{name}",
                        "ms": t_fb - results[-2]["ms"]})
        del x, xr
        torch.cuda.empty_cache()

    name = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__} on {name}, rows {args.rows}, vocab {args.vocab}")
    for r in results:
        r.update({"rows": args.rows, "vocab": args.vocab, "device": name})
        print(f"{r['case']:<32} {r['ms']:10.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
