#!/usr/bin/env bash
# The shared-library build (BUILD_SHARED_LIBS=ON): configures and builds the library alone in
# a fresh tree (the command line is left out to keep this short), installs it, then builds the
# consumer project docs/install.md shows with Highway, OpenSSL and MPI made unfindable (a
# libdetlogp.so consumer needs none of their development files) and runs it.
# Usage: install_shared_test.sh <source-dir> <work-dir>
set -euo pipefail
src=$1
mkdir -p "$2"
work=$(mktemp -d "$2/shared.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DDETLOGP_BUILD_TOOLS=OFF -DDETLOGP_BUILD_TESTS=OFF -DDETLOGP_BUILD_BENCH=OFF \
  -DDETLOGP_BUILD_PYTHON=OFF -DDETLOGP_WITH_MPI=OFF -DDETLOGP_WITH_CUDA=OFF >/dev/null
cmake --build "$work/build" -j 2 --target detlogp >/dev/null
cmake --install "$work/build" --prefix "$work/prefix" >/dev/null
ls "$work/prefix/lib/"
bash "$src/tests/install/docs_consumer.sh" "$src" "$work/my_app"
cmake -S "$work/my_app" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_hwy=ON -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON --no-warn-unused-cli >/dev/null
cmake --build "$work/consumer" -j 2 >/dev/null
needed=$(readelf -d "$work/consumer/my_app" | grep NEEDED)
echo "$needed"
grep -q 'libdetlogp\.so' <<<"$needed"
if grep -qE 'libhwy|libcrypto|libfmt' <<<"$needed"; then
  echo "install_shared: the consumer links detlogp's private dependencies itself" >&2
  exit 1
fi
"$work/consumer/my_app"
