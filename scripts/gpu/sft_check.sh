#!/usr/bin/env bash
# SFT on the GPU end to end (part of scripts/gpu/check.sh): chats packed with
# `dtrain data pack --sft`, then 20 steps of a small GPT-2 on them with run.device cpu and cuda:
# packed documents, positions in the kernels, masked prompts. Every step's loss and gradient norm
# on the GPU must be the CPU's within 1e-3 relative (both fp32; the GEMMs sum in other orders,
# which CudaBackendTest bounds at 1e-4 over 20 steps of a smaller model). Then both in bf16 with
# head size 64, where the GPU's attention runs on tensor cores and rounds P and dS to bf16 before
# multiplying (the CPU's reference rounds only its outputs): a value that lands on the other side
# of a bf16 rounding boundary moves by 2^-8 and training carries it on, so 1e-2 (as
# CudaBackendTest.TensorCorePrecisionsMatchTheCpuRounding).
#
# Usage: scripts/gpu/sft_check.sh BUILD_DIR WORK_DIR (WORK_DIR is written over).
set -euo pipefail
shopt -s inherit_errexit
build=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
python3 - "$work/chat.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as out:
    for i in range(400):
        chat = [{"role": "user", "content": f"What is {i % 50} plus one?"},
                {"role": "assistant", "content": f"It is {i % 50 + 1}."}]
        out.write(json.dumps({"messages": chat}) + "\n")
PY
"$build/dtrain" data pack --sft --chat-template chatml "$work/chat.jsonl" --out "$work/shards"
cat > "$work/sft.yaml" <<YAML
run: {name: sft, seed: 3}
model: {n_layer: 2, n_head: 2, d_model: 64, max_seq_len: 192}
data: {format: sft, train: ["$work/shards/shard-*.tar"], val_fraction: 0.1}
train: {steps: 20, batch_size: 8, micro_batch: 4, seq_len: 192, lr: 3.0e-3, min_lr: 3.0e-4,
        warmup_steps: 2, eval_every: 10, eval_batches: 2, export_to: ""}
logging: {sample_tokens: 0}
YAML
# train PRECISION TOLERANCE [--set KEY=VALUE ...]: on both devices, then the comparison.
train() {
  local precision=$1 tolerance=$2
  shift 2
  for device in cpu cuda; do
    timeout --foreground 300 "$build/dtrain" train "$work/sft.yaml" --set run.device=$device \
      --set run.precision="$precision" --set run.out_dir="$work/$precision-$device" "$@"
  done
  python3 "$(dirname "$0")/compare_metrics.py" "SFT $precision" 20 "$tolerance" \
    "$work/$precision-cpu/sft/metrics.jsonl" "$work/$precision-cuda/sft/metrics.jsonl"
}
train fp32 1e-3
train bf16 1e-2 --set model.d_model=128
