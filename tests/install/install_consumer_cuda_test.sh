#!/usr/bin/env bash
# Installs the build tree, builds a C++-only consumer that asks for COMPONENTS cuda and runs
# it (it needs no GPU). Usage: install_consumer_cuda_test.sh <build-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
make_work "$2" consumer-cuda
install_tree "$1" "$work/prefix"
test -f "$work/prefix/include/detlogp/cuda.hpp"
build_consumer "$here/consumer_cuda" "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix"
"$work/consumer/consumer_cuda"
