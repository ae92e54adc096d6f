# Sourced by every install test (bash): strict mode, the test's scratch directory, and the steps
# several tests take (installing the build tree, building a consumer project, copying the
# sources for pip, reading pyproject.toml's pins). Each step is written here once so that the
# tests differ only in what they check.
set -euo pipefail

# This folder (tests/install), for the helper scripts and consumer projects beside the tests.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# make_work <work-root> <name>: sets $work to a fresh directory under <work-root> (created if
# needed), removed when the test exits, whatever its outcome.
make_work() {
  mkdir -p "$1"
  work=$(mktemp -d "$1/$2.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}

# install_tree <build-dir> <prefix> [cmake --install options...]: installs quietly.
install_tree() {
  local build=$1 prefix=$2
  shift 2
  cmake --install "$build" --prefix "$prefix" "$@" >/dev/null
}

# build_consumer <project-dir> <build-dir> [cmake options...]: configures a consumer project
# with just the given options and builds it; on failure prints its log.
build_consumer() {
  local project=$1 build=$2
  shift 2
  mkdir -p "$build"
  cmake -S "$project" -B "$build" --no-warn-unused-cli "$@" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; return 1; }
  cmake --build "$build" -j 2 >"$build/build.log" 2>&1 || { tail -40 "$build/build.log"; return 1; }
}

# copy_sources <source-dir> <dest> [kept-entry]: <dest> becomes a copy of the sources without
# build trees, VCS data or egg-info, as a user's checkout has them (pip builds inside the source
# tree). Whatever <dest> held before goes, except its top-level [kept-entry]: a build tree kept
# there is reused, and as the files keep their times it rebuilds only what changed.
copy_sources() {
  mkdir -p "$2"
  find "$2" -mindepth 1 -maxdepth 1 ! -name "${3:-}" -exec rm -rf {} +
  tar -C "$1" --exclude=./.git --exclude='./build*' --exclude='*.egg-info' -cf - . |
    tar -C "$2" -xf -
}

# build_requires <python> <source-dir>: the build requirements pyproject.toml pins
# (build-system.requires), one a line, read from the file so that the tests install exactly
# what pip's build isolation would.
build_requires() {
  "$1" - "$2/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
PY
}

# pip_build_setup <work-root>: what pip's builds (scikit-build-core running CMake) compile with:
# ccache when there is one (CMAKE_ARGS, unless the caller set it), with <work-root> as its base
# directory so that the source copies of the pip tests share their cache entries, and
# CMAKE_BUILD_PARALLEL_LEVEL jobs (default 2, as make's JOBS).
pip_build_setup() {
  if [ -z "${CMAKE_ARGS:-}" ] && command -v ccache >/dev/null; then
    export CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(realpath "$1")} CCACHE_NOHASHDIR=1
  fi
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
}

# pipq: pip's options for the tests (quiet about its own version, never asks).
pipq=(-m pip --disable-pip-version-check --no-input)
