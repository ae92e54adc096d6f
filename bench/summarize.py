#!/usr/bin/env python3
"""Combines bench_kernels' and torch_bench.py's JSON lines into the table of docs/benchmarks.md:
elements/s, fraction of the memory floor, ratio to PyTorch, and the kernel speed goals."""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    rows = load(sys.argv[1]) + load(sys.argv[2])
    bw = next(r["bytes_per_s"] for r in rows if r["kind"] == "bandwidth")
    kern = {(r["impl"], r["op"], r["dtype"]): r for r in rows if r["kind"] == "kernel"}
    torch = {(r["op"], r["dtype"]): r for r in rows if r["kind"] == "torch"}
    print(f"\nread bandwidth: {bw / 1e9:.2f} GB/s")
    print(f"{'impl':<10} {'op':<16} {'dtype':<5} {'G elem/s':>9} {'floor':>7} {'vs torch':>9}")
    for (impl, op, dt), r in sorted(kern.items()):
        t = torch.get(("backward" if op == "backward" else "forward", dt))
        ratio = r["elements_per_s"] / t["elements_per_s"] if t else float("nan")
        print(f"{impl:<10} {op:<16} {dt:<5} {r['elements_per_s'] / 1e9:9.2f} "
              f"{100 * r['floor_fraction']:6.1f}% {ratio:8.1f}x")
    for (op, dt), t in sorted(torch.items()):
        print(f"{'torch':<10} {op:<16} {dt:<5} {t['elements_per_s'] / 1e9:9.2f}")

    def k(op, dt):
        return kern[("simd", op, dt)]

    goals = [
        ("fp32 forward >= 80% of floor", k("forward", "fp32")["floor_fraction"] >= 0.80),
        ("bf16 forward >= 5e9 elements/s", k("forward", "bf16")["elements_per_s"] >= 5e9),
        ("fp32 backward >= 90% of floor", k("backward", "fp32")["floor_fraction"] >= 0.90),
        ("bf16 backward >= 90% of floor", k("backward", "bf16")["floor_fraction"] >= 0.90),
    ]
    for dt in ("bf16", "fp32"):
        extra = k("forward+entropy", dt)["seconds"] / k("forward", dt)["seconds"] - 1
        goals.append((f"{dt} entropy adds <= 15% (adds {100 * extra:.1f}%)", extra <= 0.15))
        for op in ("forward", "backward"):
            t = torch.get((op, dt))
            if t:
                ratio = k(op, dt)["elements_per_s"] / t["elements_per_s"]
                goals.append((f"{dt} {op} >= 5x PyTorch ({ratio:.1f}x)", ratio >= 5))
    print("\ngoals:")
    for name, ok in goals:
        print(f"  [{'met' if ok else 'MISSED'}] {name}")


if __name__ == "__main__":
    main()
