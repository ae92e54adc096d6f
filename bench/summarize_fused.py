#!/usr/bin/env python3
"""The table of bench/fused_acceptance.sh: bench_fused's and torch_fused_bench.py's JSON lines
(``summarize_fused.py cpp.jsonl torch.jsonl``) as one row per shape and dtype (with this
machine's FMA peak on the same threads, bench/fma_peak.cpp, and both kernels' share of it), then
the goals:
fused forward >= 70% of sgemm's GFLOP/s, backward <= 3.3x the forward, fused forward + backward
<= 1.5x the unfused tuned path's. Ratios come from one process each (bench_fused: fused vs
sgemm; torch_fused_bench.py: fused vs matmul vs unfused); the peak memory columns from runs of
one path alone: bench_fused --fused-only's whole process (the op, its inputs and gradients),
and each torch path's peak above its process's baseline (torch, detlogp and the inputs)."""
import sys

from summarize import load


def key(r):
    return r["tokens"], r["hidden"], r["local_vocab"], r["dtype"]


def main():
    cpp, torch_rows = load(sys.argv[1]), load(sys.argv[2])
    timed = {key(r): r for r in cpp if not r.get("fused_only")}
    alone = {key(r): r for r in cpp if r.get("fused_only")}
    together = {key(r): r for r in torch_rows if len(r["modes"]) > 1}
    # One path alone: its peak above the process's baseline (torch, detlogp, the inputs).
    mem = {(key(r), r["modes"][0]): r["peak_rss_mb"] - r["baseline_rss_mb"]
           for r in torch_rows if len(r["modes"]) == 1}
    head = ["tokens x H x vocab", "dtype", "FMA peak GFLOP/s", "fused fwd GFLOP/s", "fwd/peak",
            "sgemm GFLOP/s", "sgemm/peak", "fwd/sgemm",
            "torch matmul GFLOP/s", "fwd/matmul", "bwd/fwd wall (CPU s)", "fused fwd+bwd s",
            "unfused fwd+bwd s", "fused/unfused", "torch plain fwd+bwd s",
            "peak MB: op / +fused / +unfused", "inputs+grads MB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    goals = []

    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    for k in sorted(timed):
        c, t, a = timed[k], together.get(k, {}), alone.get(k, {})
        tokens, hidden, vocab, dtype = k
        flop = 2.0 * tokens * hidden * vocab
        matmul = flop / t["matmul_forward_s"] / 1e9 if "matmul_forward_s" in t else None
        fwd = c["forward_gflops"]
        bwd = c["backward_vs_forward"]
        bwd_cpu = (c["backward_cpu_s"] / c["forward_cpu_s"]
                   if c.get("backward_cpu_s") is not None else None)
        fused_fb = t.get("fused_forward_backward_s")
        unfused_fb = t.get("unfused_forward_backward_s")
        ratio = fused_fb / unfused_fb if fused_fb and unfused_fb else None
        torch_fwd = flop / t["fused_forward_s"] / 1e9 if "fused_forward_s" in t else None
        peak = c.get("fma_peak_gflops") or None  # 0 when bench_fused ran with --skip-peak
        sgemm = c.get("sgemm_gflops")
        row = [f"{tokens} x {hidden} x {vocab}", dtype, f(peak), f(fwd),
               f(fwd / peak if peak else None, "{:.0%}"), f(sgemm),
               f(sgemm / peak if peak and sgemm else None, "{:.0%}"),
               f(c.get("forward_vs_sgemm"), "{:.0%}"), f(matmul),
               f(torch_fwd / matmul if torch_fwd and matmul else None, "{:.0%}"),
               f"{f(bwd, '{:.2f}x')} ({f(bwd_cpu, '{:.2f}x')})", f(fused_fb, "{:.2f}"),
               f(unfused_fb, "{:.2f}"), f(ratio, "{:.2f}x"),
               f(t.get("torch_forward_backward_s"), "{:.2f}"),
               f"{f(a.get('peak_rss_mb'), '{:.0f}')} / {f(mem.get((k, 'fused')), '{:.0f}')} / "
               f"{f(mem.get((k, 'unfused')), '{:.0f}')}", f(c.get("inputs_and_grads_mb"))]
        print("| " + " | ".join(row) + " |")
        where = f"{tokens} x {hidden} x {vocab} {dtype}"
        if c.get("forward_vs_sgemm") is not None:
            goals.append((f"{where}: forward >= 70% of sgemm ({c['forward_vs_sgemm']:.0%})",
                          c["forward_vs_sgemm"] >= 0.70))
        if bwd is not None:
            goals.append((f"{where}: backward <= 3.3x forward ({bwd:.2f}x wall, "
                          f"{f(bwd_cpu, '{:.2f}x')} CPU s)", bwd <= 3.3))
        if ratio is not None:
            goals.append((f"{where}: fused fwd+bwd <= 1.5x unfused ({ratio:.2f}x)", ratio <= 1.5))
    print("\ngoals:")
    for name, ok in goals:
        print(f"  [{'met' if ok else 'MISSED'}] {name}")


if __name__ == "__main__":
    main()
