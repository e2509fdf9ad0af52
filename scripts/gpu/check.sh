#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (run on one H200: README.md, "On one GPU"): builds dtrain
# with the CUDA toolkit for this machine's GPU and runs the tests that need one
# (dtrain_gpu_tests, ctest label gpu), which skip everywhere else: the CUDA kernels and every
# CudaBackend method against the CPU backend, the small model trained 20 steps on GPU against CPU
# and twice on GPU bit for bit (CudaBackendTest), NCCL collectives against a sequential reference
# (NcclCommunicatorTest); then `dtrain train` of the built-in tiny recipe with run.device: cuda,
# through the CUDA module the binary loads; SFT's packed documents trained on the GPU against the
# CPU (scripts/gpu/sft_check.sh); with several GPUs, DDP, ZeRO, tensor and pipeline parallelism
# over NCCL against the same layouts on the CPU (scripts/gpu/multi_gpu_check.sh); then the
# training benchmark (scripts/gpu/bench.sh: GPT-2 124M and a Llama ~1B shape against PyTorch 2 on
# the same GPU, in bf16 against PyTorch's autocast, and in float32 with bf16 tensor-core and
# float32 matmuls); last where a step's GPU time goes, kernel by kernel (scripts/gpu/profile.sh,
# Nsight Compute). Here a skip is a failure: the script says which test found no device.
# Every stage runs even when an earlier one fails; the failed ones are listed at the end.
#
# Usage: scripts/gpu/check.sh [--prebuilt] [BUILD_DIR] (default build-gpu). --prebuilt uses the
# binaries already in BUILD_DIR, built on another machine for this GPU's architecture: a build
# folder, or for a GPU machine without dtrain's Debian libraries the archive that
# scripts/gpu/bundle.sh gathers (the binaries with those libraries, unpacked into a temporary
# folder). CMAKE_CUDA_ARCHITECTURES overrides the architecture of a build here (default: native,
# this machine's GPU).
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/../.." && pwd)
prebuilt=false
if [[ ${1:-} == --prebuilt ]]; then
  prebuilt=true
  shift
fi
build=${1:-$repo/build-gpu}
gpus=()
[[ -d /proc/driver/nvidia/gpus ]] && mapfile -t gpus < <(find /proc/driver/nvidia/gpus \
  -mindepth 1 -maxdepth 1 -printf '%f\n' | sort)
if ((${#gpus[@]} == 0)); then
  echo "no NVIDIA GPU here (/proc/driver/nvidia/gpus is empty or absent): run this on a GPU" \
    "machine" >&2
  exit 1
fi
echo "GPUs: ${#gpus[@]} (PCI ${gpus[*]})"
if ! $prebuilt; then
  command -v nvcc > /dev/null || { echo "nvcc is not on PATH: install the CUDA toolkit" >&2; exit 1; }
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-native}" > /dev/null
  ninja -C "$build" dtrain dtrain_gpu_tests
else
  if [[ -f $build && $build == *.tar.gz ]]; then
    unpacked=$(mktemp -d)
    tar -C "$unpacked" -xzf "$build"
    build=$unpacked
  fi
  # CUDA's and NCCL's libraries are this machine's; where the loader's paths miss one (NCCL and
  # cuBLAS often live in a Python environment's nvidia/ packages), its folder is added.
  module=$build/libdtrain_cuda.so
  [[ -f $module ]] || module=$build/bin/libdtrain_cuda.so
  [[ -f $module ]] || { echo "no libdtrain_cuda.so in $build or $build/bin" >&2; exit 1; }
  for library in $(ldd "$module" | sed -nE 's/^\s+(\S+) => not found$/\1/p'); do
    found=$(find /usr/local /opt /usr/lib -name "$library" \( -type f -o -type l \) -print -quit \
            2> /dev/null)
    [[ -n $found ]] || { echo "$library, which libdtrain_cuda.so loads, is nowhere here:" \
      "install CUDA's libraries and NCCL" >&2; exit 1; }
    folder=$(dirname "$found")
    echo "$library: from $folder"
    export LD_LIBRARY_PATH=$folder${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
fi
log=$(mktemp)
runs=$(mktemp -d)
trap 'rm -rf "$log" "$runs" ${unpacked:+"$unpacked"}' EXIT
# The stages below all run even when one fails, so that one pass on a GPU machine (whose time is
# short) reports every result: the failed ones are listed at the end, and the exit status is 1.
failed=()
stage() {
  local name=$1 start=$SECONDS
  shift
  echo "== $name"
  if "$@"; then
    echo "== $name: passed ($((SECONDS - start)) s)"
  else
    echo "== $name: FAILED ($((SECONDS - start)) s)" >&2
    failed+=("$name")
  fi
}
# Each test binary run is bounded, so a hung kernel or collective ends the stage, not the session.
# The tests that need two GPUs are left out, saying so, where there is one.
filter=()
two_gpu_tests=(NcclCommunicatorTest.TheWatchdogEndsADeviceWaitOnAHungCollective
  NcclCommunicatorTest.RanksThatAllSendFirstMeetTheirPeersReceives)
if (( ${#gpus[@]} < 2 )); then
  filter=("--gtest_filter=-$(IFS=:; echo "${two_gpu_tests[*]}")")
  echo "one GPU: leaving out ${two_gpu_tests[*]}"
fi
gpu_tests() {
  timeout 300 "$build/tests/dtrain_gpu_tests" "${filter[@]}" | tee "$log" || return 1
  if grep -q '^\[  SKIPPED \]' "$log"; then
    echo "a GPU test skipped on a machine with a GPU (see its message above)" >&2
    return 1
  fi
}
tiny_train() {
  [[ -f $repo/data/fortunes.txt ]] || bash "$repo/scripts/prepare_demo_data.sh" || return 1
  (cd "$repo" && timeout 120 "$build/dtrain" train --set run.device=cuda \
    --set run.out_dir="$runs" --set train.steps=20)
}
stage "GPU tests" gpu_tests
stage "dtrain train of the tiny recipe on the GPU" tiny_train
stage "SFT on the GPU against the CPU" bash "$repo/scripts/gpu/sft_check.sh" "$build" "$runs/sft"
stage "layouts over NCCL against the CPU" bash "$repo/scripts/gpu/multi_gpu_check.sh" "$build" \
  "$runs/multi" "${#gpus[@]}"
stage "benchmark" bash "$repo/scripts/gpu/bench.sh" "$build"
stage "kernel profile" timeout 300 bash "$repo/scripts/gpu/profile.sh" "$build"
if ((${#failed[@]} > 0)); then
  printf 'failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "every stage passed"
