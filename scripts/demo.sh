#!/usr/bin/env bash
# From a fresh clone: install what is needed, build, and train the embedded default recipe
# (configs/tiny.yaml: a 3.2M-parameter GPT-2 on Debian's fortunes text) on this CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/prepare_demo_data.sh
exec build/dtrain train "$@"
