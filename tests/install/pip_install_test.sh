#!/usr/bin/env bash
# `pip install .` and `pip wheel .` the way a user runs them, offline with Debian's setuptools
# and wheel: into a fresh venv made with --system-site-packages (torch and numpy from Debian);
# the installed package imports from another directory and runs forward+backward; its
# extension and the wheel's load Highway from inside the package (ldd); pip lists it, and
# `pip uninstall` removes every file it installed.
# The sources are copied to <work-dir>/pip-src, which is kept from one run to the next with
# the CMake tree pip's build leaves in it (build-pip/): a rerun compiles only what changed, and
# `pip wheel` reuses what `pip install` built. The venv and the wheel are made afresh each time.
# Usage: pip_install_test.sh <python> <source-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
py=$1
make_work "$3" pip
sources=$3/pip-src
copy_sources "$2" "$sources" build-pip

"$py" -m venv --system-site-packages "$work/venv"
vpy=$work/venv/bin/python
pipq=(-m pip --disable-pip-version-check --no-input)
flags=(--no-build-isolation --no-index --no-deps)

echo "== pip install ."
(cd "$sources" && "$vpy" "${pipq[@]}" install "${flags[@]}" . >"$work/install.log" 2>&1) ||
  { tail -40 "$work/install.log"; exit 1; }
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
mkdir "$work/elsewhere"
(cd "$work/elsewhere" && "$vpy" "$here/pip_smoke.py" "$site")
"$vpy" "${pipq[@]}" list 2>/dev/null | grep -E '^detlogp '
files=$("$vpy" "${pipq[@]}" show -f detlogp | sed -n '/^Files:/,$p' | tail -n +2)
grep -q 'dist-info/RECORD' <<<"$files"
grep -q 'detlogp/libhwy.so.1' <<<"$files"
echo "== ldd of the installed extension"
bash "$here/check_ldd.sh" "$(ls "$site"/detlogp/_detlogp*.so)" "$site/detlogp"

echo "== pip wheel ."
(cd "$sources" && "$vpy" "${pipq[@]}" wheel "${flags[@]}" -w "$work/wheels" . \
  >"$work/wheel.log" 2>&1) || { tail -40 "$work/wheel.log"; exit 1; }
wheel=$(ls "$work"/wheels/detlogp-*.whl)
echo "$(basename "$wheel")"
mkdir "$work/unpacked"
"$vpy" -m zipfile -e "$wheel" "$work/unpacked"
ls "$work/unpacked/detlogp" "$work"/unpacked/detlogp-*.dist-info
bash "$here/check_ldd.sh" "$(ls "$work"/unpacked/detlogp/_detlogp*.so)" "$work/unpacked/detlogp"

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
