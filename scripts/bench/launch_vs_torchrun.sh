#!/usr/bin/env bash
# Launch to rendezvous for 8 local workers, dtrain against torchrun (see launch_vs_torchrun.py).
# Usage: scripts/bench/launch_vs_torchrun.sh [BUILD_DIR]   Environment: RUNS (5), WORKERS (8).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build}
exec /usr/bin/python3 "$repo/scripts/bench/launch_vs_torchrun.py" "$build/dtrain" \
  --runs "${RUNS:-5}" --workers "${WORKERS:-8}"
