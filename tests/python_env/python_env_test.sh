#!/usr/bin/env bash
# scripts/python-env.sh, offline (PIP_NO_INDEX), on requirements that need no download, in a
# cache of its own: it creates a venv and marks it complete; a rerun reuses it untouched; a venv
# without the marker (a run stopped half-way) is deleted and made again; a failing pip install
# leaves no directory behind and fails; other requirements get another venv; venvs of other
# keys unused for longer than DETLOGP_VENV_KEEP_DAYS are deleted, recently used ones kept.
# Usage: python_env_test.sh <source-dir> <work-dir>
set -euo pipefail
script=$1/scripts/python-env.sh
work=$2/python-env
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
export DETLOGP_VENV_CACHE=$work/cache PIP_NO_INDEX=1 PIP_FIND_LINKS=
fail() { echo "python_env_test: $*" >&2; exit 1; }

printf '# no packages\n' >"$work/req.txt"
py=$(bash "$script" "$work/req.txt" 2>"$work/log1")
venv=$(dirname "$(dirname "$py")")
[ -x "$py" ] || fail "no python at $py"
[ "$(dirname "$venv")" = "$work/cache" ] || fail "venv $venv not in DETLOGP_VENV_CACHE"
[ -f "$venv/.detlogp-complete" ] || fail "no completion marker in $venv"
"$py" -c 'import sys; assert sys.prefix != sys.base_prefix, sys.prefix' || fail "not a venv"

# Reuse: same path, nothing rebuilt (a file left in the venv survives); an old venv of another
# key is pruned, a recently used one kept.
touch "$venv/sentinel"
mkdir -p "$work/cache/venv-old" "$work/cache/venv-recent"
touch -d '30 days ago' "$work/cache/venv-old/.detlogp-used" "$work/cache/venv-old"
touch "$work/cache/venv-recent/.detlogp-used"
again=$(DETLOGP_VENV_KEEP_DAYS=14 bash "$script" "$work/req.txt" 2>"$work/log2")
[ "$again" = "$py" ] || fail "rerun gave $again, not $py"
[ -e "$venv/sentinel" ] || fail "the rerun rebuilt the complete venv"
grep -q creating "$work/log2" && fail "the rerun says it is creating a venv"
[ -e "$work/cache/venv-old" ] && fail "venv-old (unused for 30 days) was not removed"
[ -e "$work/cache/venv-recent" ] || fail "venv-recent (used now) was removed"

# A venv without the marker (the state a killed run leaves) is not reused.
rm "$venv/.detlogp-complete"
third=$(bash "$script" "$work/req.txt" 2>"$work/log3")
[ "$third" = "$py" ] || fail "rebuild gave $third, not $py"
grep -q "removing the incomplete" "$work/log3" || fail "no message about the incomplete venv"
[ -e "$venv/sentinel" ] && fail "the incomplete venv was reused"
[ -f "$venv/.detlogp-complete" ] || fail "the rebuilt venv has no marker"

# Other requirements, which pip cannot satisfy offline: another directory, removed on failure.
printf 'detlogp-no-such-package==1.0\n' >"$work/bad.txt"
if bash "$script" "$work/bad.txt" >"$work/out4" 2>"$work/log4"; then
  fail "an unsatisfiable requirement succeeded"
fi
[ -s "$work/out4" ] && fail "printed a python on failure: $(cat "$work/out4")"
bad=$(sed -n 's/^python-env: creating \([^ ]*\) from .*/\1/p' "$work/log4")
[ -n "$bad" ] && [ "$bad" != "$venv" ] || fail "other requirements did not get another venv ($bad)"
[ -e "$bad" ] && fail "the failed venv $bad was left behind"
[ -f "$venv/.detlogp-complete" ] || fail "the failure touched the good venv"
echo "python_env_test: passed"
