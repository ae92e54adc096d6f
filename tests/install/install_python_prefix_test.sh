#!/usr/bin/env bash
# `cmake --install --component python --prefix P` puts the package where the interpreter looks
# under P (DETLOGP_PYTHON_INSTALL_DIR): for Debian's python3 and P = /usr/local, a directory
# already on sys.path, so no PYTHONPATH is needed. Installs into a staging DESTDIR (the real
# /usr/local is left alone), checks the directory is on the interpreter's sys.path, that the
# package carries its libraries (ldd) and that it imports from the staged copy.
# Usage: install_python_prefix_test.sh <build-dir> <python> <install-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
build=$1
py=$2
rel=$3
make_work "$4" python-prefix
"$py" - "$rel" <<'PY'
import os, sys
rel = sys.argv[1]
wanted = [os.path.join(sys.prefix, rel)]
if rel.endswith("/dist-packages") and sys.prefix == "/usr":  # Debian: /usr/local is searched
    wanted.append(os.path.join("/usr/local", rel))
missing = [w for w in wanted if w not in sys.path]
assert not missing, f"{missing} not on {sys.executable}'s sys.path {sys.path}"
print("on sys.path:", ", ".join(wanted))
PY
DESTDIR="$work/stage" cmake --install "$build" --component python --prefix /usr/local >/dev/null
site="$work/stage/usr/local/$rel"
ls "$site/detlogp"
bash "$here/check_ldd.sh" "$(ls "$site"/detlogp/_detlogp*.so)" "$site/detlogp"
cd "$work"
PYTHONPATH="$site" "$py" -c "
import detlogp, os, sys
assert os.path.realpath(detlogp.__file__).startswith(os.path.realpath(sys.argv[1])), detlogp.__file__
print('imported', detlogp.__version__, 'from', os.path.dirname(detlogp.__file__))" "$site"
