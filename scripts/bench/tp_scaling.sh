#!/usr/bin/env bash
# Tensor parallelism on 2 cores, GPT-2 124M shape: the step time of tp 2 (2 processes, 1 thread
# each) against dp 2 (ddp, 2 processes, 1 thread each) and one process with 2 threads, as
# ratios; and the bytes rank 0 sent in its tensor-parallel group per step (metrics.jsonl's
# tp_sent_bytes) against the planner's formula for the same layout (the trainer's log line
# "the plan: N"), which must agree exactly: MISMATCH is a planner or engine bug.
# A benchmark, not a test: it prints, never fails on speed or on a mismatch.
#
# Usage: scripts/bench/tp_scaling.sh [BUILD_DIR]. Environment: STEPS (5); the first 2 steps are
# warm-up and not timed.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too
repo=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=run_ranks.sh
source "$repo/scripts/bench/run_ranks.sh"
bench_setup "$repo" "${1:-}"
steps=${STEPS:-5}
warmup=2

gpt2_124m=(model.family=gpt2 model.n_layer=12 model.n_head=12 model.d_model=768 model.d_ff=0
           model.vocab_size=50257 model.max_seq_len=1024 train.seq_len=256 train.batch_size=4
           train.micro_batch=2)


# dtrain_run NAME RANKS THREADS KEY=VALUE... -> "step_ms tp_sent_bytes planned_tp_bytes"
# (medians over the steps after the warm-up; the plan's figure from rank 0's log, or "-").
dtrain_run() {
  local name=$1 ranks=$2 threads=$3
  shift 3
  local sets=() out=$scratch/out
  for kv in run.out_dir="$out" run.name="$name" run.threads="$threads" train.steps="$steps" \
            train.warmup_steps=1 train.eval_every=0 logging.sample_tokens=0 train.export_to= \
            checkpoint.interval=0 "${gpt2_124m[@]}" "$@"; do
    sets+=(--set "$kv")
  done
  run_ranks "$ranks" "$scratch/$name" "$build/dtrain" train "$repo/configs/tiny.yaml" \
    "${sets[@]}"
  local planned
  planned=$(sed -n 's/.*tp group [0-9]* bytes (the plan: \([0-9]*\)).*/\1/p' \
    "$scratch/$name.0.log" | head -n 1)
  "$python" - "$out/$name/metrics.jsonl" "$warmup" "${planned:--}" <<'PY'
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1])][int(sys.argv[2]):]
print(statistics.median(s["step_ms"] for s in steps),
      statistics.median(s["tp_sent_bytes"] for s in steps), sys.argv[3])
PY
}

blas=$(ldd "$build/dtrain" | awk '/libopenblas/ { print $3; exit }')
kernel=$("$python" -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' "$blas" 2>/dev/null || echo unknown)
echo "GPT-2 124M shape (L12 C768 H12, vocab 50257), batch 4 x 256 tokens, micro-batch 2;"
echo "$steps steps, medians over the steps after the first $warmup; OpenBLAS kernel: $kernel"
echo "ratio: step time of that row / step time of tp2 (> 1: tp2 is faster)"

read -r tp_ms tp_bytes tp_planned <<<"$(dtrain_run tp2 2 1 parallel.tp=2)"
read -r dp_ms _ _ <<<"$(dtrain_run dp2 2 1 parallel.strategy=ddp)"
read -r one_ms _ _ <<<"$(dtrain_run one 1 2)"

printf "%-36s %10s %7s\n" layout "step ms" ratio
for row in "tp2: 2 processes x 1 thread:$tp_ms" "dp2 (ddp): 2 processes x 1 thread:$dp_ms" \
           "one process x 2 threads:$one_ms"; do
  awk -v l="${row%:*}" -v t="${row##*:}" -v r="$tp_ms" \
    'BEGIN { printf "%-36s %10.1f %7.2f\n", l, t, t / r }'
done
verdict=MISMATCH
[[ $tp_planned != - ]] && awk -v a="$tp_bytes" -v b="$tp_planned" 'BEGIN { exit !(a == b) }' &&
  verdict=MATCH
echo "tp bytes sent per step by rank 0: measured $tp_bytes, planned $tp_planned: $verdict"
