#!/usr/bin/env bash
# Runs the benchmarks of docs/benchmarks.md: bench/run.sh <build-dir>
# (`make bench` builds them into build/ and calls this). The PyTorch comparison runs under
# DETLOGP_BENCH_PYTHON (`make bench` passes the test venv's python, with torch from PyPI;
# default /usr/bin/python3). Environment: ROWS (1024), THREADS (2), REPS (5).
set -euo pipefail
build="${1:-build}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rows="${ROWS:-1024}"
threads="${THREADS:-2}"
reps="${REPS:-5}"
py="${DETLOGP_BENCH_PYTHON:-/usr/bin/python3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
"$build/bin/bench_kernels" --rows "$rows" --threads "$threads" --reps "$reps" \
  --json "$out/kernels.jsonl"
if "$py" -c 'import torch' 2>/dev/null; then
  "$py" "$here/torch_bench.py" --rows "$rows" --threads "$threads" --reps 3 \
    --json "$out/torch.jsonl"
else
  echo "PyTorch not found for $py: no PyTorch comparison" >&2
  : > "$out/torch.jsonl"
fi
/usr/bin/python3 "$here/summarize.py" "$out/kernels.jsonl" "$out/torch.jsonl"

# The operator under MPI: TP=1 with two threads against TP=2 with one thread per rank, same work.
if [ -x "$build/bin/bench_operator_mpi" ]; then
  mpi=(mpiexec --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
       --mca btl_vader_single_copy_mechanism none)
  echo "operator under MPI (Qwen3 shapes, bf16, $rows tokens, forward + backward):"
  "${mpi[@]}" -n 1 "$build/bin/bench_operator_mpi" --tokens "$rows" --threads 2 | tee "$out/op1.json"
  "${mpi[@]}" -n 2 "$build/bin/bench_operator_mpi" --tokens "$rows" --threads 1 | tee "$out/op2.json"
  /usr/bin/python3 - "$out/op1.json" "$out/op2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"  TP=2 (1 thread/rank) vs TP=1 (2 threads): forward {b['forward_s'] / a['forward_s']:.3f}x, "
      f"backward {b['backward_s'] / a['backward_s']:.3f}x (goal <= 1.15x)")
print(f"  bytes sent per rank per forward at TP=2: {b['preflight_bytes_per_rank']} preflight + "
      f"{b['payload_bytes_per_rank_with_entropy']} payload = {100 * b['sent_fraction_of_shard']:.3f}% "
      f"of its {b['shard_bytes'] / 1e6:.1f} MB shard (goal <= 1%); preflight {b['preflight_us']:.1f} us")
PY
fi
