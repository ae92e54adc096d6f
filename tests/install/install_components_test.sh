#!/usr/bin/env bash
# What each install component holds: `--component core` installs the public headers without
# mpi_comm.hpp (it needs mpi.h; a build without MPI has no component mpi at all), and
# `--component mpi`, when MPI was built, adds it next to libdetlogp_mpi.
# Usage: install_components_test.sh <build-dir> <work-dir> <with-mpi: ON|OFF>
source "$(dirname "$0")/lib.sh"
build=$1
make_work "$2" components
inc=$work/prefix/include/detlogp
install_tree "$build" "$work/prefix" --component core
test -f "$inc/detlogp.hpp"
if [ -e "$inc/mpi_comm.hpp" ]; then
  echo "install_components: --component core installed $inc/mpi_comm.hpp" >&2
  exit 1
fi
echo "core: $(ls "$inc" | tr '\n' ' ')"
if [ "$3" = ON ]; then
  install_tree "$build" "$work/prefix" --component mpi
  test -f "$inc/mpi_comm.hpp"
  ls "$work"/prefix/lib*/libdetlogp_mpi.*
fi
