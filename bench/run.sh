#!/usr/bin/env bash
# Runs the benchmarks of docs/benchmarks.md: bench/run.sh <build-dir>
# (built by `make build`; `make bench` calls this). PyTorch is Debian's python3-torch, run with
# /usr/bin/python3. Environment: ROWS (1024), THREADS (2), REPS (5).
set -euo pipefail
build="${1:-build}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rows="${ROWS:-1024}"
threads="${THREADS:-2}"
reps="${REPS:-5}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
"$build/bin/bench_kernels" --rows "$rows" --threads "$threads" --reps "$reps" \
  --json "$out/kernels.jsonl"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  /usr/bin/python3 "$here/torch_bench.py" --rows "$rows" --threads "$threads" --reps 3 \
    --json "$out/torch.jsonl"
else
  echo "PyTorch not found for /usr/bin/python3: no PyTorch comparison" >&2
  : > "$out/torch.jsonl"
fi
/usr/bin/python3 "$here/summarize.py" "$out/kernels.jsonl" "$out/torch.jsonl"
