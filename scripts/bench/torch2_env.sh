#!/usr/bin/env bash
# The modern PyTorch peer of the benchmarks: PyTorch 2.x from PyPI in its own virtual environment,
# apart from Debian's python3-torch 1.13 (no system site packages) and from the test references
# (scripts/python_env.sh). PyPI's Linux wheel brings its CUDA libraries along (gigabytes), so the
# benchmarks install it on first use only; CI never runs this. Idempotent; prints its python.
#   DTRAIN_TORCH2_ENV  where the environment lives (default ~/.cache/dtrain/torch2-env)
set -euo pipefail
env_dir=${DTRAIN_TORCH2_ENV:-$HOME/.cache/dtrain/torch2-env}
python=$env_dir/bin/python
if ! "$python" -c 'import torch; assert int(torch.__version__.split(".")[0]) >= 2' 2>/dev/null; then
  echo "installing PyTorch 2 from PyPI into $env_dir (first use; several GiB)" >&2
  /usr/bin/python3 -m venv "$env_dir" >&2
  "$python" -m pip install --quiet --disable-pip-version-check 'torch>=2' numpy >&2
fi
echo "$python"
