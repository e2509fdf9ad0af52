#!/usr/bin/env bash
# Configures and builds dtrain (Release, Ninja) into build/; extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > build.log 2>&1 || {
  cat build.log >&2
  exit 1
}
rm -f build.log
ninja -C build
