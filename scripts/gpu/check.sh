#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (never run yet: no GPU machine was available where this was
# written): builds dtrain with the CUDA toolkit for this machine's GPU and runs the tests that
# need one, which skip everywhere else: the CUDA kernels against the CPU backend
# (CudaDeviceTest) and NCCL collectives against a sequential reference (NcclCommunicatorTest).
# Here a skip is a failure: the script says which test found no device. The training benchmark
# (GPT-2 124M and a Llama ~1B shape, tokens/s and MFU next to llm.c's figure) joins it with the
# CUDA backend, which does not exist yet.
#
# Usage: scripts/gpu/check.sh [BUILD_DIR] (default build-gpu). CMAKE_CUDA_ARCHITECTURES
# overrides the architecture (default: native, this machine's GPU).
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build-gpu}
gpus=()
[[ -d /proc/driver/nvidia/gpus ]] && mapfile -t gpus < <(find /proc/driver/nvidia/gpus \
  -mindepth 1 -maxdepth 1 -printf '%f\n' | sort)
if ((${#gpus[@]} == 0)); then
  echo "no NVIDIA GPU here (/proc/driver/nvidia/gpus is empty or absent): run this on a GPU" \
    "machine" >&2
  exit 1
fi
command -v nvcc > /dev/null || { echo "nvcc is not on PATH: install the CUDA toolkit" >&2; exit 1; }
echo "GPUs: ${#gpus[@]} (PCI ${gpus[*]})"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-native}" > /dev/null
ninja -C "$build" dtrain_tests
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$build/tests/dtrain_tests" --gtest_filter='CudaDevice*:NcclCommunicator*' | tee "$log"
if grep -q '^\[  SKIPPED \]' "$log"; then
  echo "a GPU test skipped on a machine with a GPU (see its message above)" >&2
  exit 1
fi
echo "GPU tests passed"
