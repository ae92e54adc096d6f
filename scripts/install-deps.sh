#!/usr/bin/env bash
# Checks the Debian packages detlogp needs and installs the missing ones, as root only.
#   scripts/install-deps.sh run   what `make run` builds: the core library and the command line
#   scripts/install-deps.sh all   everything `make test` and `make bench` build (the default)
# When every package is present, nothing else happens: no apt-get, no root needed. When some
# are missing and this is not root, it names them and stops (exit 1) without touching apt.
# DETLOGP_SKIP_DEPS=1 skips the check (another distribution, packages from elsewhere).
# Python packages (torch, numpy, pytest, ...) are not Debian's: the tests run in a venv made
# from python/requirements/test.txt by scripts/python-env.sh (docs/install.md).
set -euo pipefail

profile=${1:-all}

RUN_PACKAGES=(
  build-essential cmake pkg-config
  libhwy-dev                      # SIMD with runtime dispatch
  libssl-dev                      # SHA-256 (contract fingerprint, digests)
  nlohmann-json3-dev              # JSON provenance
  libfmt-dev                      # formatting
  libcli11-dev                    # command line
)
ALL_PACKAGES=(
  "${RUN_PACKAGES[@]}"
  libopenmpi-dev openmpi-bin      # MPI transport
  libgtest-dev libbenchmark-dev   # tests and benchmarks
  libopenblas-dev                 # bench_fused's sgemm baseline (benchmark only)
  pybind11-dev python3-dev                                # Python package (headers, CMake files)
  python3-venv                                            # the test venv (scripts/python-env.sh)
  python3-pip python3-setuptools python3-wheel            # pip install test
  clang libclang-rt-14-dev        # libFuzzer targets
)

case "$profile" in
  run) packages=("${RUN_PACKAGES[@]}") ;;
  all) packages=("${ALL_PACKAGES[@]}") ;;
  *) echo "install-deps: unknown profile '$profile' (expected run or all)" >&2; exit 2 ;;
esac

if [ "${DETLOGP_SKIP_DEPS:-0}" = 1 ]; then
  exit 0
fi
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: no dpkg-query (not Debian?): install the equivalents of" \
       "${packages[*]} and run again with DETLOGP_SKIP_DEPS=1" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  {
    echo "install-deps: these Debian packages are missing: ${missing[*]}"
    echo "install-deps: ask an administrator to install them, e.g."
    echo "    sudo apt-get install --no-install-recommends ${missing[*]}"
    echo "install-deps: then run make again (or DETLOGP_SKIP_DEPS=1 make ... to try anyway)"
  } >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
