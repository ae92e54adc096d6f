#!/usr/bin/env bash
# Installs the build tree, builds a C++-only consumer that asks for COMPONENTS mpi, and runs
# it under mpirun -np 2 (TP=2 over MPI, bitwise equal to TP=1).
# Usage: install_consumer_mpi_test.sh <build-dir> <work-dir> <mpiexec> [flags...]
source "$(dirname "$0")/lib.sh"
make_work "$2" consumer-mpi
install_tree "$1" "$work/prefix"
build_consumer "$here/consumer_mpi" "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix"
mpiexec=$3
shift 3
"$mpiexec" "$@" -np 2 "$work/consumer/consumer_mpi"
