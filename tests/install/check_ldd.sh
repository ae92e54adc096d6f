#!/usr/bin/env bash
# check_ldd.sh <shared-object> <package-dir> [wheel]: every library the object loads (ldd)
# resolves either inside <package-dir> or to the base system (the C/C++ runtime, OpenSSL's
# libcrypto). With "wheel" the base system is the C/C++ runtime alone (what a manylinux wheel
# may take from the system: libcrypto must be linked in). Fails on a library not found, on
# libhwy/libfmt from outside the package and on libtorch.
set -euo pipefail
so=$1
pkg=$(realpath "$2")
base='linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1'
if [ "${3:-}" != wheel ]; then
  base+='|libcrypto\.so\.3'
fi
base="^($base)\$"
status=0
while read -r line; do
  name=${line%% *}
  path=""
  if [[ $line == *" => "* ]]; then
    path=${line#* => }
    path=${path%% (*}
  fi
  short=$(basename "$name")
  if [[ $path == "not found" ]]; then
    echo "check_ldd: $short not found" >&2; status=1; continue
  fi
  case "$short" in
    libtorch*|libc10*) echo "check_ldd: $so links $short (libtorch must never be linked)" >&2
                       status=1; continue ;;
  esac
  if [[ -n $path && $(realpath "$path") == "$pkg"/* ]]; then
    echo "  $short => inside the package"
  elif [[ $short =~ $base ]]; then
    echo "  $short => base system"
  else
    echo "check_ldd: $short resolves to ${path:-$name}, outside the package and the base system" >&2
    status=1
  fi
done < <(ldd "$so")
exit $status
