#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs the consumer project
# docs/install.md shows (project(my_app CXX), find_package(detlogp), nothing else: no C++
# standard, no build type), configured the way the docs say (-DCMAKE_PREFIX_PATH only) plus
# MPI made unfindable: the core package may not ask for it.
# Usage: install_consumer_test.sh <build-dir> <source-dir> <work-dir>
set -euo pipefail
build=$1
src=$2
mkdir -p "$3"
work=$(mktemp -d "$3/consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
bash "$src/tests/install/docs_consumer.sh" "$src" "$work/my_app"
cat "$work/my_app/CMakeLists.txt"
cmake -S "$work/my_app" -B "$work/my_app/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON --no-warn-unused-cli >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/my_app/build" -j 2 >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
"$work/my_app/build/my_app"
