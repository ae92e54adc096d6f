#!/usr/bin/env bash
# The shared-library build (BUILD_SHARED_LIBS=ON): configures and builds the library alone (the
# command line is left out to keep this short), installs it, then builds the consumer project
# docs/install.md shows with Highway, OpenSSL and MPI made unfindable (a libdetlogp.so consumer
# needs none of their development files) and runs it. The library's build tree,
# <work-dir>/shared-build, is kept from one run to the next so that a rerun compiles only what
# changed; the prefix and the consumer are made afresh each time.
# Usage: install_shared_test.sh <source-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
src=$1
make_work "$2" shared
library=$2/shared-build
cmake -S "$src" -B "$library" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DDETLOGP_BUILD_TOOLS=OFF -DDETLOGP_BUILD_TESTS=OFF -DDETLOGP_BUILD_BENCH=OFF \
  -DDETLOGP_BUILD_PYTHON=OFF -DDETLOGP_WITH_MPI=OFF -DDETLOGP_WITH_CUDA=OFF >/dev/null
cmake --build "$library" -j 2 --target detlogp >/dev/null
install_tree "$library" "$work/prefix"
ls "$work/prefix/lib/"
bash "$here/docs_consumer.sh" "$src" "$work/my_app"
build_consumer "$work/my_app" "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_hwy=ON -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
needed=$(readelf -d "$work/consumer/my_app" | grep NEEDED)
echo "$needed"
grep -q 'libdetlogp\.so' <<<"$needed"
if grep -qE 'libhwy|libcrypto|libfmt' <<<"$needed"; then
  echo "install_shared: the consumer links detlogp's private dependencies itself" >&2
  exit 1
fi
"$work/consumer/my_app"
