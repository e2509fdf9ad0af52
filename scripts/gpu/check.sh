#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (run on one H200: README.md, "On one GPU"): builds dtrain with
# the CUDA toolkit for this machine's GPU, or takes binaries built elsewhere, and checks it in
# stages, each bounded in seconds (in brackets; 540 in all on one GPU, to fit a 10-minute call
# on a lent machine; no stage runs past DTRAIN_CHECK_BUDGET_S, default 540, from the start, a
# build here included, so that on a lent machine --prebuilt leaves the stages the most time):
# - gpu-tests [150]: dtrain_gpu_tests (ctest label gpu), one suite per process
#   (scripts/gpu/gpu_tests.sh): the CUDA kernels and every CudaBackend method against the CPU
#   backend, the small model trained 20 steps on GPU against CPU and twice on GPU bit for bit,
#   NCCL collectives against a sequential reference. Here a skip is a failure;
# - tiny-train [45]: `dtrain train` of the built-in tiny recipe with run.device cuda, through the
#   CUDA module the binary loads;
# - sft [75]: SFT's packed documents trained on the GPU against the CPU
#   (scripts/gpu/sft_check.sh);
# - multi-gpu [180]: with several GPUs, DDP, ZeRO, tensor and pipeline parallelism over NCCL
#   against the same layouts on the CPU (scripts/gpu/multi_gpu_check.sh; not run on one GPU);
# - benchmark [180]: GPT-2 124M and a Llama ~1B shape in bf16 against PyTorch 2 on the same GPU
#   (scripts/gpu/bench.sh);
# - profile [90]: each kernel's GPU time in a GPT-2 124M step (scripts/gpu/profile.sh, Nsight
#   Compute; not run where ncu is missing or cannot read the GPU's counters).
# Every stage runs even when an earlier one fails. Each stage's output goes to
# DTRAIN_CHECK_OUT/<n>-<stage>.log and its outcome to DTRAIN_CHECK_OUT/summary.txt as it ends,
# with its tables and "== " lines (the test suites'), so a run cut off leaves what finished
# (default: a new temporary folder, named at the end).
# Exit status 1 where a stage failed or ran out of time; one that cannot run here is listed.
#
# Usage: scripts/gpu/check.sh [--prebuilt] [BUILD_DIR] (default build-gpu). --prebuilt uses the
# binaries already in BUILD_DIR, built on another machine for this GPU's architecture: a build
# folder, or for a GPU machine without dtrain's Debian libraries the archive that
# scripts/gpu/bundle.sh gathers (unpacked into a temporary folder). CMAKE_CUDA_ARCHITECTURES
# overrides the architecture of a build here (default: native, this machine's GPU).
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/../.." && pwd)
prebuilt=false
if [[ ${1:-} == --prebuilt ]]; then
  prebuilt=true
  shift
fi
build=$(realpath -m "${1:-$repo/build-gpu}")
results=$(realpath -m "${DTRAIN_CHECK_OUT:-$(mktemp -d)}")
mkdir -p "$results"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$repo"

if $prebuilt; then
  if [[ -f $build && $build == *.tar.gz ]]; then
    mkdir "$scratch/bundle"
    tar -C "$scratch/bundle" -xzf "$build"
    build=$scratch/bundle
  fi
  # A bundle keeps the binaries in bin/ and their libraries in lib/, behind wrappers that put
  # lib/ first on LD_LIBRARY_PATH; a build folder has the binaries in place.
  if [[ -d $build/bin ]]; then
    binaries=("$build"/bin/{dtrain,libdtrain_cuda.so,dtrain_gpu_tests})
  else
    binaries=("$build"/{dtrain,libdtrain_cuda.so,tests/dtrain_gpu_tests})
  fi
  for binary in "${binaries[@]}"; do
    [[ -f $binary ]] || { echo "no $binary: give a build folder or bundle.sh's archive" >&2; exit 1; }
  done
  # CUDA's and NCCL's libraries are this machine's. Where the loader misses one (NCCL and cuBLAS
  # often live in a Python environment's nvidia/ packages), its folder goes into
  # DTRAIN_LIBRARY_PATH, which the bundle's wrappers add to LD_LIBRARY_PATH for dtrain alone:
  # PyTorch (the benchmark's peer) and Nsight Compute keep their own cuBLAS and NCCL.
  missing=$(LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "${binaries[@]}" |
    sed -nE 's/^\s+(\S+) => not found$/\1/p' | sort -u | xargs)
  library_path=
  for library in $missing; do
    found=$(find /usr/local /opt /usr/lib -name "$library" \( -type f -o -type l \) -print -quit \
      2> /dev/null || true)
    [[ -n $found ]] || { echo "$library, which dtrain loads, is nowhere here (/usr/local, /opt," \
      "/usr/lib): install it (CUDA's and NCCL's are the machine's own; dtrain's Debian libraries" \
      "come in bundle.sh's archive)" >&2; exit 1; }
    echo "$library: from $(dirname "$found")"
    [[ :$library_path: == *:$(dirname "$found"):* ]] ||
      library_path=$library_path${library_path:+:}$(dirname "$found")
  done
  if [[ -n $library_path && ! -d $build/bin ]]; then
    echo "the loader misses $missing: take bundle.sh's archive (its wrappers add the folders" \
      "for dtrain alone) or put $library_path on LD_LIBRARY_PATH yourself" >&2
    exit 1
  fi
  export DTRAIN_LIBRARY_PATH=$library_path
fi

# The GPUs by PCI address, or by nvidia-smi where /proc/driver/nvidia is absent (gVisor).
gpus=()
[[ -d /proc/driver/nvidia/gpus ]] && mapfile -t gpus < <(find /proc/driver/nvidia/gpus \
  -mindepth 1 -maxdepth 1 -printf 'PCI %f\n' | sort)
if ((${#gpus[@]} == 0)) && command -v nvidia-smi > /dev/null; then
  mapfile -t gpus < <(nvidia-smi -L 2> /dev/null | sed -nE 's/^(GPU [0-9]+: .*) \(UUID.*/\1/p')
fi
if ((${#gpus[@]} == 0)); then
  echo "no NVIDIA GPU here (none in /proc/driver/nvidia/gpus or nvidia-smi -L): run this on a" \
    "GPU machine" >&2
  exit 1
fi
{
  echo "dtrain GPU check of $(git rev-parse --short HEAD 2> /dev/null || echo "an unknown commit")," \
    "$(date -u '+%F %T UTC'); ${#gpus[@]} GPU(s):"
  printf '  %s\n' "${gpus[@]}"
} | tee "$results/summary.txt"

# The budget counts from here, a build included: the whole check fits one call.
deadline=$((SECONDS + ${DTRAIN_CHECK_BUDGET_S:-540}))
if ! $prebuilt; then
  command -v nvcc > /dev/null || { echo "nvcc is not on PATH: install the CUDA toolkit" >&2; exit 1; }
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-native}" > /dev/null
  ninja -C "$build" dtrain dtrain_gpu_tests
fi
# A library the loader finds but cannot use (one built for a newer glibc than this machine's)
# would fail every stage alike: said once, here.
"$build/dtrain" --version > /dev/null ||
  { echo "dtrain does not start here: the loader's error is above" >&2; exit 1; }
# A driver older than the CUDA runtime the CUDA module was built with fails every stage alike
# ("CUDA driver version is insufficient"): said once, here. The floors are NVIDIA's (CUDA 12:
# 525.60, CUDA 13: 580.65, Linux).
cuda_module=$(dirname "${binaries[0]:-$build/dtrain}")/libdtrain_cuda.so
runtime=$(LD_LIBRARY_PATH=$build/lib${DTRAIN_LIBRARY_PATH:+:$DTRAIN_LIBRARY_PATH}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  ldd "$cuda_module" 2> /dev/null | sed -nE 's/^\s+libcudart\.so\.([0-9]+) .*/\1/p' | head -n 1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -n 1 || true)
declare -A driver_floor=([12]=525.60 [13]=580.65)
if [[ -n $runtime && -n $driver && -n ${driver_floor[$runtime]:-} ]] &&
  [[ $(printf '%s\n' "${driver_floor[$runtime]}" "$driver" | sort -V | head -n 1) != "${driver_floor[$runtime]}" ]]; then
  echo "the NVIDIA driver here is $driver, and dtrain's CUDA module was built with CUDA" \
    "$runtime, which needs a driver of at least ${driver_floor[$runtime]}: update the driver," \
    "or build dtrain with the CUDA toolkit this driver supports (nvidia-smi names it)" >&2
  exit 1
fi
# The demo text: the repository's, a bundle's, or made here (Debian's fortunes package).
if [[ ! -f data/fortunes.txt && -f $build/data/fortunes.txt ]]; then
  mkdir -p data
  cp "$build/data/fortunes.txt" data/
fi
[[ -f data/fortunes.txt ]] || bash scripts/prepare_demo_data.sh ||
  echo "no demo text data/fortunes.txt: the stages that train on it will fail" >&2

failed=()
not_run=()
stages=0
# stage NAME BUDGET_S COMMAND...: runs COMMAND for at most BUDGET_S seconds, fewer where the
# run's deadline comes first (then TERM, and KILL 5 s later, to its whole process group), its
# output also into the results. Exit status 77 means that it cannot run here (automake's skip).
stage() {
  local name=$1 limit=$(($2 < deadline - SECONDS ? $2 : deadline - SECONDS)) start=$SECONDS
  shift 2
  stages=$((stages + 1))
  local log=$results/$stages-$name.log status=0 outcome
  echo "== $name (at most $limit s)"
  if ((limit > 0)); then
    timeout -k 5 "$limit" "$@" 2>&1 | tee "$log" || status=$?
  else
    echo "no time left" > "$log"
    status=124
  fi
  case $status in
    0) outcome=passed ;;
    77) outcome="not run: $(tail -n 1 "$log")"; not_run+=("$name") ;;
    124 | 137) outcome="FAILED: out of time at $limit s"; failed+=("$name") ;;
    *) outcome="FAILED (exit $status): $(tail -n 1 "$log" | cut -c 1-200)"; failed+=("$name") ;;
  esac
  grep -E '^(== |\| )' "$log" >> "$results/summary.txt" || true
  echo "== $name: $outcome ($((SECONDS - start)) s)" | tee -a "$results/summary.txt"
}
stage gpu-tests 150 bash scripts/gpu/gpu_tests.sh "$build" "${#gpus[@]}"
stage tiny-train 45 "$build/dtrain" train --set run.device=cuda \
  --set run.out_dir="$scratch/runs" --set train.steps=20
stage sft 75 bash scripts/gpu/sft_check.sh "$build" "$scratch/sft"
stage multi-gpu 180 bash scripts/gpu/multi_gpu_check.sh "$build" "$scratch/multi" "${#gpus[@]}"
stage benchmark 180 bash scripts/gpu/bench.sh "$build"
# Last, with whatever time is left (on one GPU the multi-GPU stage takes none): Nsight Compute
# replays every kernel of start-up and the step, and a run cut off prints no table.
stage profile "$deadline" bash scripts/gpu/profile.sh "$build"

echo "results in $results"
((${#not_run[@]} == 0)) || echo "not run here: ${not_run[*]}" | tee -a "$results/summary.txt"
if ((${#failed[@]} > 0)); then
  echo "failed: ${failed[*]}" | tee -a "$results/summary.txt" >&2
  exit 1
fi
echo "every stage that ran passed" | tee -a "$results/summary.txt"
