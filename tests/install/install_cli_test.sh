#!/usr/bin/env bash
# `cmake --install --component cli` installs bin/detlogp, and the installed binary runs.
# Usage: install_cli_test.sh <build-dir> <work-dir> <expected-version>
set -euo pipefail
build=$1
mkdir -p "$2"
work=$(mktemp -d "$2/cli.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" --component cli >/dev/null
out=$("$work/prefix/bin/detlogp" --version)
echo "$out"
grep -qF "$3" <<<"$out"
