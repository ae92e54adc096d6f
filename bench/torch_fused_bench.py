#!/usr/bin/env python3
"""PyTorch baseline of the fused lm_head benchmark (bench_fused), same shapes:

forward:  logits = hidden @ W.T (fp32), log_softmax, gather of the targets
backward: autograd of logp.sum() into hidden and W.
Best of --reps, torch.set_num_threads(--threads); peak resident memory of the process at the
end (run once per token count). One JSON object on stdout.
"""
import json
import resource
import time

import torch

from bench_args import int_options


def best(fn, reps):
    out = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def main():
    ap = int_options(tokens=512, hidden=4096, vocab=37984, threads=2, reps=1)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    # The leaves themselves require grad (no second copy of the weight); the forward-only
    # timing runs them under no_grad.
    hidden = torch.randn(args.tokens, args.hidden).to(dtype).requires_grad_(True)
    weight = (torch.randn(args.vocab, args.hidden) * 0.04).to(dtype).requires_grad_(True)
    target = (torch.arange(args.tokens) * 7919) % args.vocab

    def forward():
        with torch.no_grad():
            z = (hidden @ weight.T).float()
            return torch.log_softmax(z, -1).gather(1, target[:, None])

    fwd = best(forward, args.reps)
    h, w = hidden, weight
    state = {}

    def fwd_bwd():
        h.grad = None
        w.grad = None
        z = (h @ w.T).float()
        state["logp"] = torch.log_softmax(z, -1).gather(1, target[:, None])
        state["logp"].sum().backward()

    total = best(fwd_bwd, args.reps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"bench": "torch", "dtype": args.dtype, "tokens": args.tokens,
                      "hidden": args.hidden, "local_vocab": args.vocab, "threads": args.threads,
                      "torch": torch.__version__, "forward_s": round(fwd, 4),
                      "forward_backward_s": round(total, 4), "peak_rss_mb": round(rss, 1)}))


if __name__ == "__main__":
    main()
