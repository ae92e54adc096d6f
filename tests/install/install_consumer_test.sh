#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs a consumer project
# declared project(x CXX) that calls find_package(detlogp) with MPI made unfindable: the core
# package may not ask for it. Usage: install_consumer_test.sh <build-dir> <source-dir> <work-dir>
set -euo pipefail
build=$1
src=$2
mkdir -p "$3"
work=$(mktemp -d "$3/consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
  --no-warn-unused-cli >/dev/null
cmake --build "$work/consumer" -j 2 >/dev/null
"$work/consumer/consumer"
