#!/usr/bin/env bash
# Builds the io layer's libFuzzer targets with clang (ASan + UBSan + libFuzzer), independently of
# the main g++ build, and runs each for a bounded time. Exits non-zero on any finding (crash,
# sanitizer report, uncaught exception, timeout, or memory beyond the limits), 77 (ctest: skipped)
# when clang's libFuzzer is not available.
#
# usage: tests/fuzz/run.sh <build-dir> [seconds-per-target]
#   env: DETLOGP_FUZZ_CXX (default clang++), DETLOGP_FUZZ_SECONDS (default and minimum 60;
#        DETLOGP_FUZZ_ALLOW_SHORT=1 allows less: the smoke run of make test, a quick local check)
# Targets: safetensors_fuzz, npy_fuzz (the readers) and header_fuzz (the header parser's worst
# cases: many keys, deep nesting).
# Outputs under <build-dir>/fuzz/: the binaries, the growing corpus, logs and crash artifacts.
set -euo pipefail

build=${1:?usage: run.sh <build-dir> [seconds-per-target]}
seconds=${2:-${DETLOGP_FUZZ_SECONDS:-60}}
# The long tier (make test-long) runs every target for at least a minute.
if (( seconds < 60 )) && [[ -z ${DETLOGP_FUZZ_ALLOW_SHORT:-} ]]; then seconds=60; fi
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cxx=${DETLOGP_FUZZ_CXX:-clang++}
mkdir -p "$build"
out=$(cd "$build" && pwd)/fuzz
mkdir -p "$out/obj" "$out/artifacts" "$out/corpus"

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "io_fuzz: SKIP: $cxx not found"; exit 77
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer - -o "$out/obj/probe" >/dev/null 2>&1; then
  echo "io_fuzz: SKIP: $cxx cannot link -fsanitize=fuzzer (install libclang-rt-dev)"; exit 77
fi

sanitize=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
cxxflags=(-std=c++20 -O1 -g "${sanitize[@]}" -fsanitize=fuzzer-no-link -Wall -Wextra -Werror
          -I"$src/include" -I"$src/src")
# Under src/: the io layer and the memory layer it uses.
io_sources=(io/tensor io/file memory/memory io/safetensors io/safetensors_header io/npy
            io/tensor_file)
headers=("$src"/src/io/*.hpp "$src"/src/memory/*.hpp "$src"/include/detlogp/*.hpp)

# $1 is stale when missing or older than any of the remaining arguments.
stale() {
  local target=$1; shift
  [[ -e $target ]] || return 0
  local dep
  for dep in "$@"; do [[ $dep -nt $target ]] && return 0; done
  return 1
}

pids=()
for name in "${io_sources[@]}"; do
  obj="$out/obj/${name//\//_}.o"
  if stale "$obj" "$src/src/$name.cpp" "${headers[@]}"; then
    echo "io_fuzz: compiling src/$name.cpp"
    "$cxx" "${cxxflags[@]}" -c "$src/src/$name.cpp" -o "$obj" &
    pids+=($!)
    if (( ${#pids[@]} >= 2 )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done

objs=()
for name in "${io_sources[@]}"; do objs+=("$out/obj/${name//\//_}.o"); done
targets=(safetensors npy header)
# Dictionaries: the header target shares the .safetensors one.
declare -A dict=([safetensors]=safetensors [npy]=npy [header]=safetensors)
# Starting corpora made by make_corpus.py.
declare -A corpus_dir=([safetensors]=safetensors [npy]=npy [header]=safetensors_header)
for target in "${targets[@]}"; do
  bin="$out/${target}_fuzz"
  if stale "$bin" "$src/tests/fuzz/${target}_fuzz.cpp" "${objs[@]}"; then
    echo "io_fuzz: linking ${target}_fuzz"
    "$cxx" "${cxxflags[@]}" -fsanitize=fuzzer "$src/tests/fuzz/${target}_fuzz.cpp" "${objs[@]}" \
      -lfmt -o "$bin"
  fi
done

# The starting corpus: valid files of every dtype and several shapes, regenerated each run.
rm -rf "$out/valid"
if command -v python3 >/dev/null 2>&1; then
  python3 "$src/tests/fuzz/make_corpus.py" "$out/valid"
fi
mkdir -p "$out/valid/safetensors" "$out/valid/npy" "$out/valid/safetensors_header"

status=0
for target in "${targets[@]}"; do
  mkdir -p "$out/corpus/$target"
  log="$out/${target}_fuzz.log"
  echo "io_fuzz: running ${target}_fuzz for ${seconds}s (log: $log)"
  if "$out/${target}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
      -timeout=10 -print_final_stats=1 -dict="$src/tests/fuzz/${dict[$target]}.dict" \
      -artifact_prefix="$out/artifacts/${target}-" \
      "$out/corpus/$target" "$out/valid/${corpus_dir[$target]}" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units:[[:space:]]*//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec:[[:space:]]*//p' "$log")
    rss=$(sed -n 's/^stat::peak_rss_mb:[[:space:]]*//p' "$log")
    units=$(find "$out/corpus/$target" -type f | wc -l)
    echo "io_fuzz: ${target}_fuzz: OK, ${runs:-?} executions in ${seconds}s (${rate:-?}/s)," \
      "peak RSS ${rss:-?} MB, corpus $units files"
  else
    status=1
    echo "io_fuzz: ${target}_fuzz: FAILED; the end of its log:"
    tail -n 60 "$log"
    ls -1 "$out/artifacts/" | sed 's/^/io_fuzz: artifact: /' || true
  fi
done
exit "$status"
