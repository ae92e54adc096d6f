#!/usr/bin/env bash
# The wheel the way a release is made (docs/install.md): `pip wheel .` with build isolation
# (pip fetches pyproject.toml's build requirements into a build environment of its own), then
# `auditwheel repair`, which gives the manylinux tag `auditwheel show` names and finds nothing
# to vendor (no detlogp.libs/: the package carries Highway itself, libcrypto is linked in); the
# repaired wheel holds the package alone (no headers, static libraries or command line) and
# installs into a fresh venv (numpy beside it, nothing of the system's site-packages), where
# the extension loads only the C/C++ runtime from the system and everything else from inside
# the wheel (ldd), and the package imports and computes with LD_LIBRARY_PATH empty.
# This cannot uninstall the Debian -dev packages the build used; the checks above show what
# the installed package loads instead.
# The sources are copied to <work-dir>/wheel-src, kept from one run to the next with pip's
# CMake tree (build-pip/): a rerun compiles the library only where it changed, the bindings
# always (pybind11's headers lie in pip's build environment, a new directory each time).
# PyPI or pip's cache needed.
# Usage: pip_wheel_test.sh <python> <source-dir> <work-dir> <version>
source "$(dirname "$0")/lib.sh"
py=$1
version=$4
make_work "$3" wheel
sources=$3/wheel-src
copy_sources "$2" "$sources" build-pip
pip_build_setup "$3"

"$py" -m venv "$work/tools"
tpy=$work/tools/bin/python
"$tpy" "${pipq[@]}" install -q -r "$sources/python/requirements/wheel.txt"

echo "== pip wheel ."
(cd "$sources" && "$tpy" "${pipq[@]}" wheel --no-deps -w "$work/dist" . >"$work/wheel.log" 2>&1) ||
  { tail -40 "$work/wheel.log"; exit 1; }
wheel=$(ls "$work"/dist/detlogp-*.whl)
echo "$(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
case "$(basename "$wheel")" in
  "detlogp-$version-"*-linux_x86_64.whl) ;;
  *) echo "pip wheel: expected detlogp-$version-*-linux_x86_64.whl" >&2; exit 1 ;;
esac

echo "== auditwheel show, auditwheel repair"
PATH=$work/tools/bin:$PATH auditwheel show "$wheel" >"$work/show.log" 2>&1 ||
  { cat "$work/show.log"; exit 1; }
tag=$(tr -s ' \n' ' ' <"$work/show.log" |
      grep -o 'consistent with the following platform tag: "manylinux_[0-9]*_[0-9]*_x86_64"' |
      grep -o 'manylinux_[0-9_]*x86_64') ||
  { cat "$work/show.log"; echo "auditwheel show named no manylinux tag" >&2; exit 1; }
echo "auditwheel show: $tag"
PATH=$work/tools/bin:$PATH auditwheel repair -w "$work/repaired" "$wheel" \
  >"$work/repair.log" 2>&1 || { cat "$work/repair.log"; exit 1; }
fixed=$(ls "$work"/repaired/detlogp-*.whl)
echo "$(basename "$fixed") ($(du -k "$fixed" | cut -f1) KiB)"
[[ $(basename "$fixed") == "detlogp-$version-"*"-$tag.whl" ]] ||
  { echo "repaired wheel not tagged $tag" >&2; exit 1; }

mkdir "$work/unpacked"
"$tpy" -m zipfile -e "$fixed" "$work/unpacked"
(cd "$work/unpacked" && find . -type f | sed 's|^\./||' | sort) >"$work/contents"
if stray=$(grep -Ev '^detlogp/[^/]+\.(py|so(\.[0-9]+)*)$|^detlogp-[^/]+\.dist-info/[A-Z]+$' \
  "$work/contents"); then
  echo "the wheel holds more than the package: $stray" >&2
  exit 1
fi
diff <(cd "$2/python/detlogp" && ls ./*.py | sed 's|^\./|detlogp/|') \
  <(grep '\.py$' "$work/contents")

echo "== a fresh venv: numpy and the repaired wheel"
"$py" -m venv "$work/venv"
vpy=$work/venv/bin/python
"$vpy" "${pipq[@]}" install -q -r "$sources/python/requirements/smoke.txt"
"$vpy" "${pipq[@]}" install -q --no-index --no-deps "$fixed"
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
bash "$here/check_ldd.sh" "$(ls "$site"/detlogp/_detlogp*.so)" "$site/detlogp" wheel
mkdir "$work/elsewhere"
(cd "$work/elsewhere" && LD_LIBRARY_PATH= "$vpy" "$here/pip_smoke.py" "$site")
