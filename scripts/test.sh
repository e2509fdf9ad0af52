#!/usr/bin/env bash
# From a fresh clone: install what is needed, build, and run every test (unit, PyTorch parity,
# integration) with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/prepare_demo_data.sh
cd build
ctest --output-on-failure --timeout 900 -j 2
