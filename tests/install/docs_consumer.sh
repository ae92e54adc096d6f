#!/usr/bin/env bash
# Writes the consumer project docs/install.md shows ("A consumer project ..."), word for word,
# into <dest-dir>: its CMakeLists.txt is the first ```cmake block after that sentence, and the
# program is tests/install/consumer/main.cpp. The install tests build it exactly as the docs
# say, so that whatever the docs leave out (a C++ standard, say) the installed package must
# provide. Usage: docs_consumer.sh <source-dir> <dest-dir>
set -euo pipefail
src=$1
dest=$2
mkdir -p "$dest"
awk '/^A consumer project/ { found = 1 }
     found && /^```cmake$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' "$src/docs/install.md" >"$dest/CMakeLists.txt"
if ! grep -q 'find_package(detlogp' "$dest/CMakeLists.txt"; then
  echo "docs_consumer.sh: no consumer project (a \`\`\`cmake block after 'A consumer project')" \
    "in $src/docs/install.md" >&2
  exit 1
fi
cp "$src/tests/install/consumer/main.cpp" "$src/tests/install/consumer/problem.hpp" "$dest/"
