#!/usr/bin/env python3
"""Table of bench/torch_api_bench.py output (JSON lines on stdin or in the files given):
the ratios of docs/benchmarks.md "The functional torch API", by minimum and by median."""

import fileinput
import json

ROWS = [
    ("functional forward / C++ op forward (goal <= 1.1x)", "fn_fwd", "op_fwd"),
    ("  causal-shift view / C++ op forward", "fn_fwd_shift", "op_fwd"),
    ("backward, fresh torch.empty / reused (the problem)", "bwd_fresh", "bwd_reused"),
    ("backward, fresh MADV_HUGEPAGE / reused", "bwd_fresh_hugepage", "bwd_reused"),
    ("backward, pooled (out=None) / reused (goal <= 1.25x)", "bwd_pooled", "bwd_reused"),
    ("functional autograd backward / reused (goal <= 1.25x)", "fn_bwd", "bwd_reused"),
    ("Megatron-style PyTorch fwd+bwd / functional fwd+bwd (goal >= 5x bf16, >= 3x fp32)",
     "megatron", "fn_fwd_bwd"),
]


def main():
    lines = [json.loads(line) for line in fileinput.input() if line.strip()]
    for r in lines:
        if "dtype" in r:
            print(f"TP={r['tp']} {r['dtype']} {r['rows']} tokens, {r['threads_per_rank']} "
                  f"thread(s)/rank, {r['kernel']}: op forward {1e3 * r['op_fwd']:.0f} ms")
            for text, a, b in ROWS:
                if a in r and b in r:
                    print(f"  {text}: {r[a] / r[b]:.2f}x (min) "
                          f"{r[a + '_median'] / r[b + '_median']:.2f}x (median)")
        else:
            print(f"TP={r['tp']} per call at {r['overhead_rows']} tokens x "
                  f"{r['overhead_cols']}: functional preparation {r['fn_prepare_ms']:.3f} ms "
                  f"(goal < 1 ms); functional - op call {r['overhead_ms']:.3f} ms (min) "
                  f"{r['overhead_ms_median']:.3f} ms (median); contract from a list "
                  f"{1e3 * r['contract_from_list']:.3f} ms; MaskSpec from a bool tensor "
                  f"{1e3 * r['mask_spec_from_bool_tensor']:.3f} ms; cache {r['cache_stats']}")


if __name__ == "__main__":
    main()
