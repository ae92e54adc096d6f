#!/usr/bin/env bash
# Builds the CUDA backend's GPU test and benchmark here (no GPU needed) and packs what a GPU
# machine needs to run them into one folder (docs/cuda.md):
#
#   scripts/gpu-bundle.sh [BUILD_DIR=build-cuda] [BUNDLE_DIR=build-gpu-bundle]
#
#   BUNDLE_DIR/bin/cuda_kernels_test   GPU tests (gtest; static CUDA runtime)
#   BUNDLE_DIR/bin/bench_cuda          GPU benchmark
#   BUNDLE_DIR/bin/detlogp             the command line with --device cuda (no MPI: the
#                                      in-process rank group covers TP > 1)
#   BUNDLE_DIR/torch_bench_cuda.py     PyTorch on the same GPU and shapes
#   BUNDLE_DIR/lib/                    the shared libraries the binaries need beyond glibc
#                                      (libhwy, libfmt, libcrypto, libstdc++, libgcc_s):
#                                      scripts/gpu-check.sh puts them on LD_LIBRARY_PATH
#   BUNDLE_DIR/MANIFEST                git revision, compiler, sizes, sha256
#
# The default bundle folder matches .gitignore's /build*/, so it never gets committed: hand it to
# the device tool with carry ["build-gpu-bundle"] and run scripts/gpu-check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
BUNDLE=${2:-build-gpu-bundle}
JOBS=${JOBS:-2}

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDETLOGP_BUILD_PYTHON=OFF \
  -DDETLOGP_BUILD_TOOLS=ON -DDETLOGP_WITH_MPI=OFF -DDETLOGP_WITH_CUDA=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target cuda_kernels_test bench_cuda detlogp_cli

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
cp "$BUILD/tests/cuda_kernels_test" "$BUILD/bin/bench_cuda" "$BUILD/bin/detlogp" "$BUNDLE/bin/"
cp src/kernels/cuda/torch_bench_cuda.py "$BUNDLE/"
strip --strip-unneeded "$BUNDLE/bin/"* 2>/dev/null || true

# Shared libraries beyond glibc and the dynamic loader (those come with any Linux).
for lib in $(ldd "$BUNDLE/bin/"* | awk '/=> \// {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) continue ;;
  esac
  cp -L "$lib" "$BUNDLE/lib/"
done

{
  echo "detlogp GPU bundle"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "glibc needed: $(objdump -T "$BUNDLE/bin/"* | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)"
  echo "files:"
  (cd "$BUNDLE" && find . -type f ! -name MANIFEST | sort | xargs sha256sum)
} > "$BUNDLE/MANIFEST"

size_kib=$(du -sk "$BUNDLE" | cut -f1)
echo "gpu-bundle: $BUNDLE, $((size_kib / 1024)) MiB"
if [ "$size_kib" -gt $((60 * 1024)) ]; then
  echo "gpu-bundle: larger than 60 MiB; the device tool carries at most 64 MiB in all" >&2
  exit 1
fi
