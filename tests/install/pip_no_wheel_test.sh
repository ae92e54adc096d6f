#!/usr/bin/env bash
# `pip install --no-build-isolation .` under an interpreter that has setuptools but no wheel
# (a plain venv, or a pyenv Python): pip must stop at once with setup.py's message naming
# both fixes, not with setuptools' "invalid command 'bdist_wheel'", and before CMake runs.
# Skipped (exit 77) where a plain venv of <python> has no setuptools, or already has wheel or
# a setuptools with bdist_wheel built in.
# Usage: pip_no_wheel_test.sh <python> <source-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
py=$1
make_work "$3" pip-no-wheel
copy_sources "$2" "$work/src"
"$py" -m venv "$work/venv"
vpy=$work/venv/bin/python
if ! "$vpy" -c 'import setuptools' 2>/dev/null ||
  "$vpy" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("wheel") or u.find_spec("setuptools.command.bdist_wheel")))'; then
  echo "pip_no_wheel: a plain venv of $py has no setuptools, or can build wheels already: skipped"
  exit 77
fi
if (cd "$work/src" && "$vpy" -m pip --disable-pip-version-check --no-input install \
  --no-build-isolation --no-index --no-deps . >"$work/log" 2>&1); then
  echo "pip_no_wheel: pip install succeeded without wheel" >&2
  exit 1
fi
cat "$work/log"
grep -q "no 'wheel' package" "$work/log"
grep -q -- "-m pip install wheel" "$work/log"
grep -q -- "without --no-build-isolation" "$work/log"
if grep -q "invalid command 'bdist_wheel'" "$work/log" || grep -q -- "-- Configuring" "$work/log"; then
  echo "pip_no_wheel: setuptools or CMake ran before the missing wheel was reported" >&2
  exit 1
fi
