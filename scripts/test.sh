#!/usr/bin/env bash
# From a fresh clone: install what is needed, build, and run every test: the tar reader's
# libFuzzer target for a bounded time (clang), then unit, PyTorch parity and multi-process
# tests with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/prepare_demo_data.sh

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DDTRAIN_FUZZ=ON > build-fuzz.log 2>&1 || {
  cat build-fuzz.log >&2
  exit 1
}
rm -f build-fuzz.log
ninja -C build-fuzz tar_fuzz
(cd build-fuzz && ctest -R '^fuzz\.tar$' --output-on-failure)

cd build
ctest --output-on-failure --timeout 900 -j 2
