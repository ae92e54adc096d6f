#!/usr/bin/env bash
# Installs the build tree, builds a C++-only consumer that asks for COMPONENTS cuda and runs
# it (it needs no GPU). Usage: install_consumer_cuda_test.sh <build-dir> <source-dir> <work-dir>
set -euo pipefail
build=$1
src=$2
mkdir -p "$3"
work=$(mktemp -d "$3/consumer-cuda.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/detlogp/cuda.hpp"
cmake -S "$src/tests/install/consumer_cuda" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" -j 2 >/dev/null
"$work/consumer/consumer_cuda"
