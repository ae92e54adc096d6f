#!/usr/bin/env bash
# scripts/install-deps.sh against fake dpkg-query, id, apt-get and sudo on PATH:
#   every package present -> exit 0, apt-get never runs (root or not);
#   packages missing, not root -> exit 1, the missing packages named, apt-get and sudo never run;
#   packages missing, root -> apt-get install of exactly the missing ones;
#   `run` checks only what the library and the command line need.
# Usage: install_deps_test.sh <source-dir> <work-dir>
source "$(dirname "$0")/lib.sh"
script=$1/scripts/install-deps.sh
make_work "$2" deps
mkdir "$work/bin"
cat >"$work/bin/dpkg-query" <<'FAKE'
#!/usr/bin/env bash
# dpkg-query -W -f=FORMAT PACKAGE: "installed" unless PACKAGE is in $FAKE_MISSING.
p=${!#}
for m in $FAKE_MISSING; do [ "$m" = "$p" ] && exit 1; done
printf 'install ok installed'
FAKE
printf '#!/usr/bin/env bash\necho "$FAKE_UID"\n' >"$work/bin/id"
printf '#!/usr/bin/env bash\necho "apt-get $*" >>"$FAKE_LOG"\n' >"$work/bin/apt-get"
printf '#!/usr/bin/env bash\necho "sudo $*" >>"$FAKE_LOG"\n' >"$work/bin/sudo"
chmod +x "$work/bin"/*
export PATH="$work/bin:$PATH" FAKE_LOG="$work/log"

run() {  # run <uid> <missing> <profile>: sets rc, out
  : >"$FAKE_LOG"
  set +e
  out=$(FAKE_UID=$1 FAKE_MISSING=$2 bash "$script" "$3" 2>&1)
  rc=$?
  set -e
}
fail() { echo "install_deps: $*" >&2; echo "$out" >&2; cat "$FAKE_LOG" >&2; exit 1; }

for uid in 0 1000; do
  run "$uid" "" all
  [ "$rc" -eq 0 ] && [ ! -s "$FAKE_LOG" ] || fail "uid $uid, nothing missing: rc $rc"
done

run 1000 "libhwy-dev libgtest-dev" all
[ "$rc" -eq 1 ] || fail "missing packages as non-root: rc $rc, expected 1"
[ ! -s "$FAKE_LOG" ] || fail "missing packages as non-root ran apt-get or sudo"
grep -q "missing: libhwy-dev libgtest-dev" <<<"$out" || fail "the message does not name them"
echo "$out"

run 1000 "libgtest-dev" run
[ "$rc" -eq 0 ] && [ ! -s "$FAKE_LOG" ] || fail "'run' asked for a test-only package"

run 0 "libhwy-dev python3-venv" all
[ "$rc" -eq 0 ] || fail "root install: rc $rc"
grep -q "apt-get install .*libhwy-dev python3-venv$" "$FAKE_LOG" || fail "root: no apt-get install"
echo "install_deps: ok"
