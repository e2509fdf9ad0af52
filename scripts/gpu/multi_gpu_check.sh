#!/usr/bin/env bash
# Training on several GPUs of one node (part of scripts/gpu/check.sh): one `dtrain train` process
# per GPU (torchrun's variables), the mesh groups on NCCL, for DDP, ZeRO-1, ZeRO-3, tensor and
# pipeline parallelism; each layout also runs on the CPU (Gloo) with the same world, and every
# step's loss and gradient norm on the GPUs must be the CPU's within 1e-3 relative (fp32 both;
# the sums run in other orders). Then a hung rank: rank 1 of 2 stopped mid-run must be the
# launcher's root cause, which rank 0's timed-out NCCL operation blames (data parallel and pp 2).
# NCCL refuses two ranks on one GPU, so with fewer than 2 GPUs the check says so and exits 77
# (not run, as check.sh counts it).
#
# Usage: scripts/gpu/multi_gpu_check.sh BUILD_DIR WORK_DIR GPUS (WORK_DIR is written over).
set -euo pipefail
shopt -s inherit_errexit
build=$1
work=$2
gpus=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
if ((gpus < 2)); then
  echo "$gpus GPU here, and NCCL needs a GPU per rank"
  exit 77
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
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout --foreground 300 "$build/dtrain" train \
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

# hung DEVICE NAME OVERRIDES...: 2 ranks of the embedded recipe under `dtrain launch`; once they
# train, rank 1 is stopped (SIGSTOP, a hung GPU or process). Rank 0's collective (its
# communicator reads which collectives rank 1 started) or, at pp 2, possibly its receive from
# rank 1 must time out within parallel.timeout_s and blame rank 1, so the agent's root cause is
# rank 1, hung, and no rank is left behind.
hung() {
  local device=$1 name=$2 log=$work/hung-$1-$2.log i pid stopped=
  shift 2
  (cd "$repo" && timeout --foreground 300 "$build/dtrain" launch --nproc-per-node 2 \
    --set run.device="$device" --set run.threads=1 --set run.out_dir="$work/hung-$device-$name" \
    --set train.steps=100000 --set train.batch_size=8 --set train.micro_batch=2 \
    --set train.warmup_steps=2 --set train.eval_every=0 --set parallel.timeout_s=20 "$@" \
    > "$log" 2>&1) &
  local launcher=$!
  for ((i = 0; i < 120; i++)); do
    grep -q 'step 3/' "$log" && break
    sleep 1
  done
  for pid in $(pgrep -f "$build/dtrain" || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx 'DTRAIN_RANK=1'; then
      kill -STOP "$pid"
      stopped=$pid
    fi
  done
  local status=0
  wait "$launcher" || status=$?
  if [[ -n $stopped ]]; then kill -KILL "$stopped" 2> /dev/null || true; fi
  if [[ -z $stopped ]] || ((status != 1)) || ! grep -q 'Root cause: rank 1 on node 0' "$log" \
    || ! grep -q 'hung' "$log"; then
    tail -n 30 "$log" >&2
    echo "hung rank, $name on $device: expected the launcher to exit 1 naming rank 1" \
      "(status $status)" >&2
    exit 1
  fi
  echo "hung rank, $name on $device: the root cause named rank 1"
}
hung cuda dp
hung cuda pp2 --set parallel.pp=2
