#!/usr/bin/env bash
# Installs the build tree, builds a C++-only consumer that asks for COMPONENTS mpi, and runs
# it under mpirun -np 2 (TP=2 over MPI, bitwise equal to TP=1).
# Usage: install_consumer_mpi_test.sh <build-dir> <source-dir> <work-dir> <mpiexec> [flags...]
set -euo pipefail
build=$1
src=$2
mkdir -p "$3"
work=$(mktemp -d "$3/consumer-mpi.XXXXXX")
mpiexec=$4
shift 4
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/tests/install/consumer_mpi" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" -j 2 >/dev/null
"$mpiexec" "$@" -np 2 "$work/consumer/consumer_mpi"
