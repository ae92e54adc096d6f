#!/usr/bin/env bash
# `pip install .` the offline way (docs/install.md): into a fresh venv that holds the build
# requirements pyproject.toml pins (scikit-build-core, pybind11) and numpy (smoke.txt), then
# `pip install --no-build-isolation --no-index .`, which reaches no package index. The installed
# package imports from another directory and runs forward+backward; its extension loads Highway
# from inside the package and nothing of OpenSSL (libcrypto is linked in: ldd); pip lists it
# with the version of CMakeLists.txt, its files are the package alone, and `pip uninstall`
# removes every one.
# The sources are copied to <work-dir>/pip-src, which is kept from one run to the next with the
# CMake tree pip's build leaves in it (build-pip/): a rerun compiles only what changed. The venv
# (<work-dir>/pip-venv) is made afresh each time; filling it takes PyPI or pip's cache.
# Usage: pip_install_test.sh <python> <source-dir> <work-dir> <version>
source "$(dirname "$0")/lib.sh"
py=$1
version=$4
make_work "$3" pip
sources=$3/pip-src
copy_sources "$2" "$sources" build-pip
pip_build_setup "$3"

# Made afresh, at the same path each run: the build finds pybind11's headers where it did
# before, so a rerun recompiles nothing that did not change.
rm -rf "$3/pip-venv"
"$py" -m venv "$3/pip-venv"
vpy=$3/pip-venv/bin/python
mapfile -t needs < <(build_requires "$vpy" "$sources")
echo "== into the venv: ${needs[*]} and python/requirements/smoke.txt"
"$vpy" "${pipq[@]}" install -q "${needs[@]}" -r "$sources/python/requirements/smoke.txt"

echo "== pip install --no-build-isolation --no-index ."
(cd "$sources" && "$vpy" "${pipq[@]}" install --no-build-isolation --no-index --no-deps . \
  >"$work/install.log" 2>&1) || { tail -40 "$work/install.log"; exit 1; }
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
mkdir "$work/elsewhere"
(cd "$work/elsewhere" && "$vpy" "$here/pip_smoke.py" "$site")
"$vpy" "${pipq[@]}" list 2>/dev/null | grep -E "^detlogp +$version\$"
files=$("$vpy" "${pipq[@]}" show -f detlogp | sed -n '/^Files:/,$p' | tail -n +2 | sed 's/^ *//')
grep -q 'dist-info/RECORD' <<<"$files"
grep -qx 'detlogp/libhwy.so.1' <<<"$files"
if stray=$(grep -Ev '^(detlogp/|detlogp-[^/]*\.dist-info/)' <<<"$files"); then
  echo "pip install put files outside the package: $stray" >&2
  exit 1
fi
echo "== ldd of the installed extension"
bash "$here/check_ldd.sh" "$(ls "$site"/detlogp/_detlogp*.so)" "$site/detlogp" wheel

echo "== pip uninstall"
"$vpy" "${pipq[@]}" uninstall -y detlogp >/dev/null
left=0
while read -r f; do
  if [ -e "$site/$f" ]; then
    echo "pip uninstall left $site/$f" >&2
    left=1
  fi
done <<<"$files"
if ls -d "$site"/detlogp* 2>/dev/null; then
  echo "pip uninstall left the entries above in $site" >&2
  left=1
fi
if (cd "$work/elsewhere" && "$vpy" -c "import detlogp" 2>/dev/null); then
  echo "detlogp still imports after pip uninstall" >&2
  left=1
fi
exit $left
