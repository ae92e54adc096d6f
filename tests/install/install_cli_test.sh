#!/usr/bin/env bash
# `cmake --install --component cli` installs bin/detlogp, and the installed binary runs.
# Usage: install_cli_test.sh <build-dir> <work-dir> <expected-version>
source "$(dirname "$0")/lib.sh"
make_work "$2" cli
install_tree "$1" "$work/prefix" --component cli
out=$("$work/prefix/bin/detlogp" --version)
echo "$out"
grep -qF "$3" <<<"$out"
