#!/usr/bin/env bash
# The CUDA backend's GPU check (docs/cuda.md), for a GPU machine with CUDA, CMake and
# PyTorch but none of detlogp's build dependencies: it only RUNS binaries built elsewhere by
# scripts/gpu-bundle.sh. In a few minutes:
#
#   1. the GPU tests (bitwise equality with the CPU reference; TP = 1/2/4; the operator),
#   2. the benchmark (D2D copy bandwidth, bf16/fp32 forward at N=4096 x 151936, backward),
#   3. PyTorch on the same GPU and shapes (when python3 has torch with CUDA),
#   4. the command line on the GPU (when the bundle has bin/detlogp): `detlogp run --device cuda
#      --tokens 256` (TP 1, 2, 4 on one GPU, checked bitwise across TP and against float64),
#      its digests against `detlogp run --device cpu` on the same batch (GPU bits == CPU bits),
#      and `detlogp bench --device cuda`,
#   5. a short table, printed last.
#
#   scripts/gpu-check.sh [BUNDLE_OR_BUILD_DIR=build-gpu-bundle]
#
# Logs and JSON go to $OUT (the device tool's output folder) when set, else to
# BUNDLE/gpu-check-out/. Exit status: 0 when the tests passed (or skipped: no GPU), 1 otherwise.
# Env: ROWS (4096), VOCAB (151936), REPS (10), TEST_TIMEOUT (420 s), BENCH_TIMEOUT (240 s),
# CLI_TOKENS (256), CLI_TIMEOUT (120 s per command).
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-gpu-bundle}
ROWS=${ROWS:-4096}
VOCAB=${VOCAB:-151936}
REPS=${REPS:-10}
if [ -x "$DIR/bin/cuda_kernels_test" ]; then         # a bundle
  TEST=$DIR/bin/cuda_kernels_test
  BENCH=$DIR/bin/bench_cuda
  TORCH=$DIR/torch_bench_cuda.py
  CLI=$DIR/bin/detlogp
  export LD_LIBRARY_PATH="$(cd "$DIR/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ -x "$DIR/tests/cuda_kernels_test" ]; then     # a build folder on this machine
  TEST=$DIR/tests/cuda_kernels_test
  BENCH=$DIR/bin/bench_cuda
  TORCH=src/kernels/cuda/torch_bench_cuda.py
  CLI=$DIR/bin/detlogp
else
  echo "gpu-check: no cuda_kernels_test under $DIR (run scripts/gpu-bundle.sh first)" >&2
  exit 2
fi
LOG=${OUT:-$DIR/gpu-check-out}
mkdir -p "$LOG"
PY=$(command -v python3 || true)

echo "== machine"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
[ -f "$DIR/MANIFEST" ] && head -5 "$DIR/MANIFEST"
[ -x "$CLI" ] || CLI=
missing=$(ldd "$TEST" "$BENCH" $CLI 2>/dev/null | grep "not found" || true)
if [ -n "$missing" ]; then
  echo "gpu-check: shared libraries missing:"; echo "$missing"; exit 2
fi

echo "== 1. GPU tests"
timeout "${TEST_TIMEOUT:-420}" "$TEST" --gtest_color=no 2>&1 | tee "$LOG/gpu_tests.log" \
  | grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|^no CUDA device|Failure|rror' \
  | awk '!/^no CUDA device/ || !seen++' | head -80
test_rc=${PIPESTATUS[0]}
tests_passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$LOG/gpu_tests.log" | grep -oE '[0-9]+$' || echo 0)
tests_skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$LOG/gpu_tests.log" | grep -oE '[0-9]+' || echo 0)
tests_failed=$(grep -oE '^ *[0-9]+ FAILED TEST' "$LOG/gpu_tests.log" | grep -oE '[0-9]+' || echo 0)

echo "== 2. benchmark (rows $ROWS, vocab $VOCAB, reps $REPS)"
rm -f "$LOG/bench_cuda.jsonl" "$LOG/torch.jsonl"
timeout "${BENCH_TIMEOUT:-240}" "$BENCH" --rows "$ROWS" --vocab "$VOCAB" --reps "$REPS" \
  --json "$LOG/bench_cuda.jsonl" 2>&1 | tee "$LOG/bench_cuda.log"

echo "== 3. PyTorch"
if [ -n "$PY" ]; then
  PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-240}" "$PY" "$TORCH" --rows "$ROWS" \
    --vocab "$VOCAB" --reps "$REPS" --json "$LOG/torch.jsonl" 2>&1 | tee "$LOG/torch.log"
else
  echo "torch_bench_cuda: SKIPPED: no python3"
fi

echo "== 4. detlogp command line (--device cuda)"
# cli_status: PASS, SKIPPED (why) or FAIL (what); the runs' JSON and logs stay in $LOG.
cli_status="SKIPPED (no bin/detlogp in $DIR)"
if [ -n "$CLI" ]; then
  CLI_TOKENS=${CLI_TOKENS:-256}
  timeout "${CLI_TIMEOUT:-120}" "$CLI" run --device cuda --tokens "$CLI_TOKENS" --json \
    >"$LOG/cli_run_cuda.json" 2>"$LOG/cli_run_cuda.err"
  run_rc=$?
  cat "$LOG/cli_run_cuda.err" | tr '\r' '\n' | grep -v '^\[' || true
  if [ "$run_rc" -eq 2 ] && grep -q -e 'no CUDA device' -e 'built without CUDA' "$LOG/cli_run_cuda.err"; then
    cli_status="SKIPPED ($(tail -1 "$LOG/cli_run_cuda.err"))"
  else
    timeout "${CLI_TIMEOUT:-120}" "$CLI" run --device cpu --tokens "$CLI_TOKENS" --json \
      >"$LOG/cli_run_cpu.json" 2>"$LOG/cli_run_cpu.err"
    cpu_rc=$?
    timeout "${CLI_TIMEOUT:-120}" "$CLI" bench --device cuda 2>"$LOG/cli_bench_cuda.err" \
      | tee "$LOG/cli_bench_cuda.log"
    bench_rc=${PIPESTATUS[0]}
    cli_status=$("${PY:-false}" - "$LOG/cli_run_cuda.json" "$LOG/cli_run_cpu.json" "$run_rc" \
                   "$cpu_rc" "$bench_rc" <<'PYEOF' || echo "FAIL (run rc $run_rc, cpu rc $cpu_rc, bench rc $bench_rc; no python3 to compare)"
import json, sys
cuda_p, cpu_p, run_rc, cpu_rc, bench_rc = sys.argv[1:]
problems = []
try:
    g = json.load(open(cuda_p))
except Exception as e:
    print(f"FAIL (run --device cuda rc {run_rc}: no JSON: {e})"); sys.exit(0)
try:
    c = json.load(open(cpu_p))
except Exception as e:
    c = None; problems.append(f"run --device cpu rc {cpu_rc}: no JSON")
for r in g["runs"]:
    print(f"  cuda TP {r['tp']} ({r['kernel']}): fwd {1e3 * r['forward_seconds']:.2f} ms, bwd "
          f"{1e3 * r['backward_seconds']:.2f} ms, replicated {r['replicated']}, equal to TP "
          f"{g['runs'][0]['tp']} {r['bitwise_equal']}, accuracy {r['accuracy']['passed']}",
          file=sys.stderr)
if run_rc != "0": problems.append(f"run --device cuda rc {run_rc}")
if not all(r["kernel"].startswith("cuda") for r in g["runs"]):
    problems.append("run --device cuda did not run the cuda kernels")
if c is not None and g["digests"] != c["digests"]:
    problems.append("digests differ from --device cpu")
if bench_rc != "0": problems.append(f"bench --device cuda rc {bench_rc}")
print("PASS (TP 1/2/4 bitwise, accuracy, digests == --device cpu, bench ran)" if not problems
      else "FAIL (" + "; ".join(problems) + ")")
PYEOF
)
  fi
fi
echo "cli: $cli_status"

echo "== summary"
if [ "$test_rc" -eq 0 ]; then
  status=PASS
  grep -q '^no CUDA device on this machine' "$LOG/gpu_tests.log" && status="SKIPPED (no CUDA device)"
elif [ "$test_rc" -eq 124 ]; then
  status="TIMEOUT"
else
  status="FAIL (rc $test_rc, $tests_failed failed)"
fi
echo "gpu tests: $status; passed $tests_passed, skipped $tests_skipped, failed $tests_failed"
echo "cli --device cuda: $cli_status"
if [ -n "$PY" ] && [ -s "$LOG/bench_cuda.jsonl" ]; then
  "$PY" - "$LOG/bench_cuda.jsonl" "$LOG/torch.jsonl" <<'PYEOF'
import json, os, sys
def load(p):
    if not os.path.exists(p): return {}
    return {r["case"]: r for r in map(json.loads, open(p)) }
ours, torch = load(sys.argv[1]), load(sys.argv[2])
d2d = ours.get("d2d_copy")
print(f"device: {d2d['device'] if d2d else '?'}; D2D copy {d2d['gbps']:.0f} GB/s (read+write)")
print(f"{'case':<26}{'ms':>9}{'GB/s':>9}{'of D2D':>9}{'torch ms':>10}{'speedup':>9}")
pairs = [("forward_bf16", "torch_forward_bf16"), ("forward_bf16_entropy", None),
         ("forward_fp32", "torch_forward_fp32"), ("forward_fp32_entropy", None),
         ("backward_bf16", "torch_backward_bf16"), ("backward_fp32", "torch_backward_fp32")]
for case, tcase in pairs:
    r = ours.get(case)
    if not r: continue
    t = torch.get(tcase) if tcase else None
    tms = f"{t['ms']:10.3f}" if t else f"{'-':>10}"
    sp = f"{t['ms'] / r['ms']:8.2f}x" if t else f"{'-':>9}"
    print(f"{case:<26}{r['ms']:9.3f}{r['gbps']:9.0f}{100 * r['fraction_of_d2d']:8.1f}%{tms}{sp}")
fb = [(ours.get(f"forward_{d}"), ours.get(f"backward_{d}"), torch.get(f"torch_forward_backward_{d}")) for d in ("bf16", "fp32")]
for d, (f, b, t) in zip(("bf16", "fp32"), fb):
    if f and b and t:
        print(f"{'fwd+bwd_' + d:<26}{f['ms'] + b['ms']:9.3f}{'':>9}{'':>9}{t['ms']:10.3f}{t['ms'] / (f['ms'] + b['ms']):8.2f}x")
print("goals: forward_bf16 >= 70% of D2D; >= 3x PyTorch")
PYEOF
else
  echo "no benchmark results (no CUDA device or no python3)"
fi
[ "$test_rc" -eq 0 ] && [ "${cli_status#FAIL}" = "$cli_status" ]
