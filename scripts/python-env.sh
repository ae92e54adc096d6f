#!/usr/bin/env bash
# The virtual environment the Python tests run in (docs/install.md): creates it from the pinned
# requirements, or reuses it when a complete one for the same requirements and interpreter exists.
#
#   scripts/python-env.sh [REQUIREMENTS=python/requirements/test.txt]
#
# With the default requirements, the pinned peers of test_peers.py (python/requirements/
# peers.txt: the real Megatron and verl) are installed too, apart, into <venv>/peers, without
# their dependencies (how and why: that file's header, docs/python.md).
#
# Prints the venv's python (the only line on stdout; pip's progress goes to stderr), e.g.
#   py=$(bash scripts/python-env.sh) && "$py" -m pytest ...
#
# The venv lives in $DETLOGP_VENV_CACHE/venv-<key> (default ~/.cache/detlogp/venv-<key>, outside
# the checkout, so that fresh clones share it). <key> is a hash of the requirements files, the base
# interpreter (path and full version) and this script's layout version: editing the
# requirements or upgrading Python makes a new venv, never patches an old one. pip's cache
# (~/.cache/pip) stays on; the wheels are also kept in $DETLOGP_VENV_CACHE/wheels (below), so a
# new venv downloads only what changed.
#
# A venv counts as complete only once the marker file .detlogp-complete is in it, written last,
# after pip install and pip check succeeded: a run that was interrupted or failed leaves no
# marker, and the next run deletes that directory and starts again. Concurrent runs for the same
# key wait on a lock (flock) instead of building twice.
#
# Venvs of other keys that no run has used for DETLOGP_VENV_KEEP_DAYS days (default 14; 0 keeps
# them all) are deleted, so that the cache does not grow with every requirements change.
#
# Env: DETLOGP_PYTHON_BASE (base interpreter, default /usr/bin/python3: Debian's python3 with
# python3-venv), DETLOGP_VENV_CACHE, DETLOGP_VENV_KEEP_DAYS.
set -euo pipefail
# The whole script is one block, read before it runs: editing or checking out this file while
# a run installs (minutes) cannot change what that run does next.
{
root=$(cd "$(dirname "$0")/.." && pwd)
req=${1:-$root/python/requirements/test.txt}
peers=
if [ $# -eq 0 ] && [ -f "$root/python/requirements/peers.txt" ]; then
  peers=$root/python/requirements/peers.txt
fi
base=${DETLOGP_PYTHON_BASE:-/usr/bin/python3}
cache=${DETLOGP_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/detlogp}
keep_days=${DETLOGP_VENV_KEEP_DAYS:-14}
layout=1 # bump when the way the venv is made changes

say() { echo "python-env: $*" >&2; }

[ -f "$req" ] || { say "no requirements file $req"; exit 2; }
describe='import os, platform, sys
print(os.path.realpath(sys.executable), platform.machine(), sys.version)'
if ! base_id=$("$base" -c "$describe" 2>/dev/null); then
  say "cannot run the base interpreter $base (set DETLOGP_PYTHON_BASE)"
  exit 2
fi
key=$({ printf 'layout %s\n%s\n' "$layout" "$base_id"; cat "$req" ${peers:+"$peers"}; } |
  sha256sum | cut -c1-16)
venv=$cache/venv-$key
wheels=$cache/wheels
marker=$venv/.detlogp-complete
used=$venv/.detlogp-used

prune_others() {
  [ "$keep_days" -gt 0 ] || return 0
  local d
  for d in "$cache"/venv-*/; do
    d=${d%/}
    [ -d "$d" ] && [ "$d" != "$venv" ] || continue
    # Only venvs not used for keep_days (a venv still being built: its directory's age), and
    # only when no run holds their lock.
    local stamp=$d/.detlogp-used
    [ -e "$stamp" ] || stamp=$d
    [ -n "$(find "$stamp" -maxdepth 0 -mmin +$((keep_days * 1440)))" ] || continue
    (
      flock -n 8 || exit 0
      say "removing $d (unused for over $keep_days days)"
      rm -rf "$d"
    ) 8>"$d.lock"
  done
}

finish() {
  touch "$used"
  prune_others
  echo "$venv/bin/python"
  exit 0
}

[ -f "$marker" ] && finish

mkdir -p "$cache"
exec 9>"$venv.lock"
if ! flock -n 9; then
  say "waiting for another run that is building $venv"
  flock 9
fi
[ -f "$marker" ] && finish # the other run built it

if [ -e "$venv" ]; then
  say "removing the incomplete $venv (an earlier run stopped before the end)"
  rm -rf "$venv"
fi
say "creating $venv from $req (python: $base)"
trap 'rm -rf "$venv"; say "failed: $venv removed"' ERR
if ! "$base" -m venv "$venv" >&2; then
  say "$base -m venv failed: on Debian install python3-venv (scripts/install-deps.sh)"
  false
fi
vpy=$venv/bin/python
pip=("$vpy" -m pip --disable-pip-version-check --no-input)
# The wheels go to a wheelhouse of our own first, then install from there alone: a new venv
# (another key) downloads only the wheels the wheelhouse lacks, even from an index whose
# responses carry no caching headers, which pip's HTTP cache then does not keep.
"${pip[@]}" download --dest "$wheels" -r "$req" >&2
"${pip[@]}" install --require-virtualenv --no-index --find-links "$wheels" -r "$req" >&2
"${pip[@]}" check >&2
if [ -n "$peers" ]; then
  apart=(--no-deps --ignore-requires-python)
  "${pip[@]}" download "${apart[@]}" --dest "$wheels" -r "$peers" >&2
  "${pip[@]}" install "${apart[@]}" --no-index --find-links "$wheels" --target "$venv/peers" \
    -r "$peers" >&2
fi
"${pip[@]}" freeze --all >"$venv/.detlogp-freeze"
trap - ERR
printf '%s\n' "$key" >"$marker.tmp"
mv "$marker.tmp" "$marker"
say "ready: $venv"
finish
}
