#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs the consumer project
# docs/install.md shows (project(my_app CXX), find_package(detlogp), nothing else: no C++
# standard, no build type), configured the way the docs say (-DCMAKE_PREFIX_PATH only) plus
# MPI made unfindable: the core package may not ask for it.
# Usage: install_consumer_test.sh <build-dir> <source-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
make_work "$3" consumer
install_tree "$1" "$work/prefix"
bash "$here/docs_consumer.sh" "$2" "$work/my_app"
cat "$work/my_app/CMakeLists.txt"
build_consumer "$work/my_app" "$work/my_app/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
"$work/my_app/build/my_app"
