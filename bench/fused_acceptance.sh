#!/usr/bin/env bash
# The fused lm_head's acceptance numbers in one table (docs/benchmarks.md, "The fused lm_head"):
# at both shapes (512 x 4096 x 37984 and 4096 x 2048 x 32768), fp32 and bf16 inputs:
#   bench_fused              fused forward GFLOP/s vs OpenBLAS sgemm (same process), backward
#   bench_fused --fused-only the fused op's peak memory alone
#   torch_fused_bench.py     forward vs torch's matmul, fwd + bwd vs the unfused tuned path
#                            (matmul + detlogp's logits op + two gradient matmuls), in one process
#   ... --modes fused / --modes unfused   each path's peak memory alone
# then bench/summarize_fused.py prints the table and the goals.
#
#   bench/fused_acceptance.sh                 # the full run (minutes: run it on a quiet machine)
#   bench/fused_acceptance.sh --quick         # small vocabularies and token counts (a smoke run)
# Environment: BUILD_DIR (default build), PYTHON (default python3, with torch and detlogp's
# build on PYTHONPATH), THREADS (default 2), REPS (default 1), OUT (default a temporary dir),
# SHAPES (other shapes, e.g. "512x4096x8192 1024x2048x8192": tokens x H x vocab).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
BUILD_DIR=${BUILD_DIR:-$root/build}
PYTHON=${PYTHON:-python3}
THREADS=${THREADS:-2}
REPS=${REPS:-1}
OUT=${OUT:-$(mktemp -d)}
shapes=("512 4096 37984" "4096 2048 32768")
if [[ "${1:-}" == "--quick" ]]; then
  shapes=("64 512 4096" "256 256 4096")
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--quick]" >&2
  exit 2
fi
if [[ -n "${SHAPES:-}" ]]; then
  shapes=()
  for s in $SHAPES; do shapes+=("${s//x/ }"); done
fi
bench=$BUILD_DIR/bin/bench_fused
[[ -x $bench ]] || { echo "$bench not found: build the target bench_fused" >&2; exit 2; }
export PYTHONPATH=$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
: > "$OUT/cpp.jsonl"
: > "$OUT/torch.jsonl"
for shape in "${shapes[@]}"; do
  read -r tokens hidden vocab <<< "$shape"
  for dtype in fp32 bf16; do
    args=(--tokens "$tokens" --hidden "$hidden" --vocab "$vocab" --threads "$THREADS"
          --reps "$REPS" --dtype "$dtype")
    echo "== $tokens x $hidden x $vocab $dtype" >&2
    "$bench" "${args[@]}" >> "$OUT/cpp.jsonl"
    "$bench" "${args[@]}" --fused-only >> "$OUT/cpp.jsonl"
    (cd "$here" && "$PYTHON" torch_fused_bench.py "${args[@]}") >> "$OUT/torch.jsonl"
    for mode in fused unfused; do
      (cd "$here" && "$PYTHON" torch_fused_bench.py "${args[@]}" --reps 1 --modes "$mode") \
        >> "$OUT/torch.jsonl"
    done
  done
done
echo "raw results: $OUT/cpp.jsonl $OUT/torch.jsonl (machine load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
"$PYTHON" "$here/summarize_fused.py" "$OUT/cpp.jsonl" "$OUT/torch.jsonl"
