#!/usr/bin/env bash
# Installs every Debian package detlogp needs, and nothing else. Idempotent: packages that
# are already present are left alone and apt is not touched at all when nothing is missing.
# Used by both `make run` and `make test` (and `make bench`).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libhwy-dev                      # SIMD with runtime dispatch
  libopenmpi-dev openmpi-bin      # MPI transport
  libssl-dev                      # SHA-256 (contract fingerprint, digests)
  nlohmann-json3-dev              # JSON provenance
  libcli11-dev                    # command line
  libfmt-dev                      # formatting
  libgtest-dev libbenchmark-dev   # tests and benchmarks
  pybind11-dev python3-dev python3-numpy python3-torch python3-pytest  # Python package
  clang libclang-rt-14-dev        # libFuzzer targets
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
