#!/usr/bin/env python3
"""The PyTorch side of the fused lm_head benchmark (bench_fused, same shapes): one rank's
hidden states [tokens, H] and lm_head shard [vocab, H] in fp32 or bf16, in one process:

matmul:  ``hidden @ W.T`` alone (torch's own tuned CPU kernels, the input dtype)
torch:   ``hidden @ W.T -> float -> log_softmax -> gather`` (PyTorch's plain path)
unfused: ``detlogp.torch.vocab_parallel_logprobs(hidden @ W.T, targets)``: the matmul, the
         detlogp logits op and, in backward, the op's logit gradient and the two gradient
         matmuls (autograd through the matmul): the tuned unfused path the fused op replaces
fused:   ``detlogp.torch.fused_vocab_parallel_logprobs(hidden, W, targets)``

With bf16 inputs torch's matmuls run on the fp32 upcast of hidden and W, made inside the timed
call (``--bf16-matmul native`` runs them in bf16: torch's CPU bf16 matmul and its backward can
be one to two orders of magnitude slower where the CPU has no bf16 dot instructions, e.g. on
AVX2). Each mode's forward (under no_grad) and forward + backward of ``logp.sum()`` into both leaves,
best of --reps, torch.set_num_threads(--threads) (detlogp's kernels take the same count). The
peak resident memory of the process is reported at the end, and before the first mode runs
(``baseline_rss_mb``: torch, detlogp and the inputs): to see one mode's memory alone, run it
alone (``--modes fused``) and subtract the baseline. One JSON object on stdout.
"""
import json
import resource
import time

import torch

from bench_args import int_options

MODES = ("matmul", "torch", "unfused", "fused")


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
    ap.add_argument("--bf16-matmul", default="fp32", choices=["fp32", "native"],
                    help="bf16 inputs: torch's matmuls on the fp32 upcast (default) or in bf16")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated, of " + ", ".join(MODES))
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    # The leaves themselves require grad (no second copy of the weight); the forward-only
    # timings run them under no_grad.
    hidden = torch.randn(args.tokens, args.hidden).to(dtype).requires_grad_(True)
    # The weight padded to whole vocab tiles (Megatron's padding: bench_fused does the same);
    # real_vocab keeps the padding rows out of the softmax.
    padded = -(-args.vocab // 128) * 128
    weight = (torch.randn(padded, args.hidden) * 0.04).to(dtype).requires_grad_(True)
    target = (torch.arange(args.tokens) * 7919) % args.vocab

    def matmul(h, w):
        """torch's ``h @ w.T``; bf16 inputs on their fp32 upcast unless --bf16-matmul native
        (the gradients flow back into the bf16 leaves through the upcast)."""
        if dtype == torch.bfloat16 and args.bf16_matmul == "fp32":
            return h.float() @ w.float().T
        return h @ w.T

    def call(mode):
        if mode == "matmul":
            return matmul(hidden, weight)
        if mode == "torch":
            z = matmul(hidden, weight[:args.vocab]).float()
            return torch.log_softmax(z, -1).gather(1, target[:, None])
        import detlogp.torch as dt

        if mode == "unfused":
            return dt.vocab_parallel_logprobs(matmul(hidden, weight), target,
                                              real_vocab=args.vocab)
        return dt.fused_vocab_parallel_logprobs(hidden, weight, target, real_vocab=args.vocab)

    out = {"bench": "torch_fused", "dtype": args.dtype, "tokens": args.tokens,
           "hidden": args.hidden, "local_vocab": args.vocab, "threads": args.threads,
           "torch": torch.__version__, "modes": modes,
           "matmul_dtype": args.dtype if dtype == torch.float32 or args.bf16_matmul == "native"
           else "fp32 upcast"}
    if "unfused" in modes or "fused" in modes:
        import detlogp.torch  # noqa: F401 - imported before the baseline, as torch is
    out["baseline_rss_mb"] = _peak_rss_mb()  # torch, detlogp and the inputs
    for mode in modes:
        def forward():
            with torch.no_grad():
                call(mode)

        out[f"{mode}_forward_s"] = round(best(forward, args.reps), 4)
        if mode == "matmul":
            continue

        def fwd_bwd():
            hidden.grad = None
            weight.grad = None
            call(mode).sum().backward()

        out[f"{mode}_forward_backward_s"] = round(best(fwd_bwd, args.reps), 4)
    out["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(out))


def _peak_rss_mb():
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


if __name__ == "__main__":
    main()
