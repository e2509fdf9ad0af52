#!/usr/bin/env bash
# Training on several GPUs of one node (part of scripts/gpu/check.sh): one `dtrain train` process
# per GPU (torchrun's variables), the mesh groups on NCCL, for DDP, ZeRO-1, ZeRO-3, tensor and
# pipeline parallelism; each layout also runs on the CPU (Gloo) with the same world, and every
# step's loss and gradient norm on the GPUs must be the CPU's within 1e-3 relative (fp32 both;
# the sums run in other orders). NCCL refuses two ranks on one GPU, so with fewer than 2 GPUs the
# check says so and passes nothing.
#
# Usage: scripts/gpu/multi_gpu_check.sh BUILD_DIR WORK_DIR GPUS (WORK_DIR is written over).
set -euo pipefail
shopt -s inherit_errexit
build=$1
work=$2
gpus=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
if ((gpus < 2)); then
  echo "multi-GPU check not run: $gpus GPU here, and NCCL needs a GPU per rank"
  exit 0
fi
rm -rf "$work"
mkdir -p "$work"
[[ -f $repo/data/fortunes.txt ]] || bash "$repo/scripts/prepare_demo_data.sh"

# train DEVICE LAYOUT_NAME OVERRIDES...: the embedded recipe on `gpus` local ranks.
train() {
  local device=$1 name=$2
  shift 2
  local port=$((29500 + RANDOM % 1000)) pids=() rank
  for ((rank = 0; rank < gpus; rank++)); do
    (cd "$repo" && RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$gpus LOCAL_WORLD_SIZE=$gpus \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 "$build/dtrain" train \
      --set run.device="$device" --set run.precision=fp32 --set run.threads=1 \
      --set run.out_dir="$work/$device-$name" \
      --set train.steps=10 --set train.batch_size=$((4 * gpus)) --set train.micro_batch=2 \
      --set train.warmup_steps=2 --set train.eval_every=5 --set parallel.timeout_s=120 "$@" \
      > "$work/$device-$name.rank$rank.log" 2>&1) &
    pids+=($!)
  done
  local failed=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if ((failed)); then
    tail -n 20 "$work/$device-$name".rank*.log >&2
    echo "$name on $device failed (logs above)" >&2
    exit 1
  fi
}

layouts=("ddp:--set parallel.strategy=ddp" "zero1:--set parallel.strategy=zero1"
  "zero3:--set parallel.strategy=zero3" "tp2:--set parallel.strategy=ddp --set parallel.tp=2"
  "pp2:--set parallel.strategy=ddp --set parallel.pp=2")
for layout in "${layouts[@]}"; do
  name=${layout%%:*}
  read -ra overrides <<< "${layout#*:}"
  for device in cpu cuda; do train "$device" "$name" "${overrides[@]}"; done
  python3 "$repo/scripts/gpu/compare_metrics.py" "$name" 10 1e-3 \
    "$work"/cpu-"$name"/*/metrics.jsonl "$work"/cuda-"$name"/*/metrics.jsonl
done
