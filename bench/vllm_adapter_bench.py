#!/usr/bin/env python3
"""What detlogp.vllm.DetlogpSampler costs on top of detlogp.sample: one batch of full rows
[rows, vocab] in bf16 (half the rows top_k 50, temperatures in [0.5, 1.5), one seed per
request, N top logprobs), sampled by ``detlogp.sample`` alone and by the adapter in each
logprobs mode (vLLM's metadata and outputs from tests/python/vllm_standin.py), A/B interleaved
in one process, best of --reps, process CPU time. One JSON object on stdout.

    PYTHONPATH=build/python python bench/vllm_adapter_bench.py --rows 64 --vocab 151936
"""

import argparse
import json
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
import detlogp  # noqa: E402
import vllm_standin as vs  # noqa: E402
from detlogp.vllm import DetlogpSampler  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--num-logprobs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows, vocab, n = a.rows, a.vocab, a.num_logprobs
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, vocab, generator=g) * 3).to(torch.bfloat16)
    t = torch.rand(rows, generator=g) + 0.5
    k = torch.where(torch.arange(rows) % 2 == 0, 50, vocab).to(torch.int32)
    md = vs.SamplingMetadata(
        temperature=t, all_greedy=False, all_random=True, top_p=None, top_k=k,
        generators={i: vs.generator(i) for i in range(rows)}, max_num_logprobs=n,
        output_token_ids=[[0] * i for i in range(rows)])
    seeds = torch.arange(rows)
    top_k = torch.where(k == vocab, 0, k)
    calls = {"sample": lambda: detlogp.sample(x, seeds, seeds, temperature=t, top_k=top_k,
                                              num_logprobs=n, threads=a.threads)}
    for mode in ("processed_logprobs", "raw_logprobs"):
        calls[mode] = (lambda s: lambda: s(x, md))(
            DetlogpSampler(outputs=vs, logprobs_mode=mode, threads=a.threads))
    best = {name: float("inf") for name in calls}
    for _ in range(a.reps):
        for name, f in calls.items():
            start = time.process_time()
            f()
            best[name] = min(best[name], time.process_time() - start)
    out = {"rows": rows, "vocab": vocab, "num_logprobs": n, "threads": a.threads,
           "sample_ms": round(best["sample"] * 1e3, 1)}
    for mode in ("processed_logprobs", "raw_logprobs"):
        out[f"{mode}_ms"] = round(best[mode] * 1e3, 1)
        out[f"{mode}_over_sample"] = round(best[mode] / best["sample"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
