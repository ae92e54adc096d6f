#!/usr/bin/env bash
# An extension built for another CPython version: `import detlogp` must say which version it
# was built for, which one runs and how to fix it (not Python's "circular import" message).
# Makes a copy of the built package whose extension carries the tag of the next CPython minor
# version. Usage: python_wrong_interpreter_test.sh <python> <built-package-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
py=$1
pkg=$2
make_work "$3" wrong-python
cp -r "$pkg" "$work/detlogp"
read -r major minor < <("$py" -c 'import sys; print(*sys.version_info[:2])')
other="$major$((minor + 1))"
ext=$(cd "$work/detlogp" && ls _detlogp.cpython-*.so)
mv "$work/detlogp/$ext" "$work/detlogp/${ext/cpython-$major$minor/cpython-$other}"
if out=$(cd "$work" && PYTHONPATH="$work" "$py" -c "import detlogp" 2>&1); then
  echo "python_wrong_interpreter: import detlogp succeeded with a cpython-$other extension" >&2
  exit 1
fi
echo "$out" | tail -1
expected="built for CPython $major.$((minor + 1)), running $major.$minor"
grep -qF "$expected" <<<"$out" || { echo "missing: '$expected'" >&2; exit 1; }
grep -qF "reinstall with pip install . under this interpreter" <<<"$out" || exit 1
if grep -q "circular import" <<<"$out"; then
  echo "python_wrong_interpreter: the message still talks about a circular import" >&2
  exit 1
fi
