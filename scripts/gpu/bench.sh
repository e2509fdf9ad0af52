#!/usr/bin/env bash
# Training throughput on one GPU: dtrain's CUDA backend against PyTorch 2 on the same GPU
# (scripts/bench/torch_train.py --device cuda --mode fast: fused attention and fused AdamW), both
# at each precision of PRECISIONS: bf16, dtrain's bf16 storage (run.precision bf16) against
# PyTorch's bf16 autocast over float32 parameters; fp32/highest and fp32/high, float32 values and
# parameters with the GEMMs in float32 (TF32 off) or TF32 on the tensor cores
# (run.matmul_precision and torch.set_float32_matmul_precision alike). Not fp32/medium: PyTorch
# has no bf16 GEMM for float32 tensors on CUDA and runs medium as TF32, so torch_train.py refuses
# it. Shapes: GPT-2 124M (B 16, T 1024) and a Llama ~1B shape (16 layers, d_model 2048, 32 query
# and 8 kv heads, d_ff 8192, B 8, T 1024), on the demo text's bytes. Prints one table row per
# shape and precision as it finishes: tokens/s of both and their ratio, MFU against the GPU's
# dense float32 peak (datasheet) and against the planner catalog's bf16 peak, and the peak device
# memory each process held (nvidia-smi, sampled every 100 ms). dtrain writes no checkpoint, and
# each run's folder is removed after its row. A benchmark: it prints, never fails on speed; a
# run that fails prints a FAILED row, the others still run, and the exit status is 1.
#
# Usage: scripts/gpu/bench.sh BUILD_DIR (a build with the CUDA module, for this GPU)
# Environment: STEPS (6) steps of each run, the first 2 untimed; PYTHON (python3), a python
# with PyTorch 2 and CUDA; FP32_PEAK_TFLOPS (67, H100/H200 SXM) and BF16_PEAK_TFLOPS (989);
# PRECISIONS ("bf16"; also "fp32/highest" and "fp32/high").
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: scripts/gpu/bench.sh BUILD_DIR}
python=${PYTHON:-python3}
steps=${STEPS:-6}
warmup_steps=2
fp32_peak=${FP32_PEAK_TFLOPS:-67}
bf16_peak=${BF16_PEAK_TFLOPS:-989}
read -r -a precisions <<< "${PRECISIONS:-bf16}"
data=$repo/data/fortunes.txt
[[ -f $data ]] || { echo "no $data: run scripts/prepare_demo_data.sh first" >&2; exit 1; }
"$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' ||
  { echo "$python has no PyTorch with CUDA: set PYTHON" >&2; exit 1; }

# shellcheck source=shapes.sh
source "$repo/scripts/gpu/shapes.sh"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# peak_device_mib COMMAND...: runs the command (output to $scratch/log) while sampling the GPU's
# used memory; prints the peak in MiB above what was in use before it started.
peak_device_mib() {
  local before
  before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 \
    > "$scratch/memory" &
  local sampler=$!
  if ! "$@" > "$scratch/log" 2>&1; then
    kill "$sampler"
    echo "failed: $*" >&2
    tail -n 30 "$scratch/log" >&2
    return 1
  fi
  kill "$sampler"
  wait "$sampler" 2> /dev/null || true
  echo $(($(sort -n "$scratch/memory" | tail -n 1) - before))
}

# run_shape ID NAME KEY=VALUE...: one dtrain run and one PyTorch run; prints the table row, or
# a FAILED row (the run's log above it) and marks the benchmark failed, going on to the next.
failed=0
run_shape() {
  local id=$1 name=$2
  shift 2
  local sets
  mapfile -t sets < <(set_flags "$@")
  local out=$scratch/dtrain-$id
  local d_mib t_mib
  d_mib=$(peak_device_mib "$build/dtrain" train "$repo/configs/tiny.yaml" "${sets[@]}" \
          --set run.device=cuda --set run.out_dir="$out" \
          --set run.name=bench \
          --set train.steps="$steps" --set train.warmup_steps=1 --set train.eval_every=0 \
          --set logging.sample_tokens=0 --set train.export_to= --set checkpoint.save_at_end=false) ||
    { echo "| $name | FAILED: dtrain (its log above) |"; failed=1; return 0; }
  cp "$scratch/log" "$scratch/dtrain-$id.log"
  local d_tps
  d_tps=$("$python" - "$out/bench/metrics.jsonl" "$warmup_steps" <<'EOF'
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(statistics.median(step["tokens_per_s"] for step in steps[int(sys.argv[2]):]))
EOF
)
  rm -rf "$out"
  t_mib=$(peak_device_mib "$python" "$repo/scripts/bench/torch_train.py" --device cuda \
          --mode fast --data "$data" --threads 1 --steps "$steps" --discard "$warmup_steps" \
          "${sets[@]}") ||
    { echo "| $name | $d_tps | FAILED: PyTorch (its log above) |"; failed=1; return 0; }
  # The last line: "tokens_per_s=X flops_per_token=Y peak_mib=Z".
  local result t_tps flops
  result=$(tail -n 1 "$scratch/log")
  t_tps=$(sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$result")
  flops=$(sed -E 's/.*flops_per_token=([0-9]+).*/\1/' <<<"$result")
  "$python" - "$name" "$d_tps" "$t_tps" "$flops" "$fp32_peak" "$bf16_peak" "$d_mib" "$t_mib" \
    <<'EOF'
import sys
name, d, t, flops, fp32, bf16, d_mib, t_mib = sys.argv[1:]
d, t, flops = float(d), float(t), float(flops)
mfu = lambda tps, peak: 100 * tps * flops / (float(peak) * 1e12)
print(f"| {name} | {d:,.0f} | {t:,.0f} | {d / t:.2f} | {mfu(d, fp32):.1f}% / {mfu(d, bf16):.1f}% "
      f"| {mfu(t, fp32):.1f}% / {mfu(t, bf16):.1f}% | {int(d_mib):,} | {int(t_mib):,} |")
EOF
}

echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0);" \
  "PyTorch $("$python" -c 'import torch; print(torch.__version__)'); $steps steps a run," \
  "the first $warmup_steps untimed; the same precision on both sides"
echo "| shape | dtrain tok/s | PyTorch 2 tok/s | ratio | dtrain MFU fp32 / bf16 peak" \
  "| PyTorch MFU fp32 / bf16 peak | dtrain peak MiB | PyTorch peak MiB |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for precision in "${precisions[@]}"; do
  # fp32/MATMUL or bf16 (whose GEMMs take bf16 values: the matmul precision is auto's).
  sets=(run.precision="${precision%%/*}")
  [[ $precision == */* ]] && sets+=(run.matmul_precision="${precision#*/}")
  run_shape "gpt2-${precision/\//-}" "GPT-2 124M, B 16, T 1024, $precision" "${gpt2_124m[@]}" \
    "${sets[@]}"
  run_shape "llama-${precision/\//-}" "Llama ~1B, B 8, T 1024, $precision" "${llama_1b[@]}" \
    "${sets[@]}"
done
# dtrain's own GEMM peak, measured at its start.
cat "$scratch"/dtrain-*.log 2> /dev/null | grep -m 1 "MFU is stated" || true
exit "$failed"
