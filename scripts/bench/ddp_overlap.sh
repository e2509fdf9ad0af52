#!/usr/bin/env bash
# Data-parallel overlap on 2 local ranks: how much of dtrain's step waits on communication
# (exposed_comm_ms / step_ms from metrics.jsonl; target <= 10%) for DDP and ZeRO-2, and the
# step time against PyTorch DDP (gloo) on the same model and global batch, as a ratio per peer:
# Debian's PyTorch 1.13 and PyTorch 2 from PyPI in its best eager settings (fused attention and
# AdamW; scripts/bench/torch2_env.sh installs it on first use, several GiB).
# A benchmark, not a test: it prints, never fails on speed.
#
# dtrain runs each engine with its gradients reduced in float32 and in bf16 (parallel.reduce_dtype);
# the peers reduce float32 (DDP's default), so a bf16 row's ratio is against their float32 step.
#
# Usage: scripts/bench/ddp_overlap.sh [BUILD_DIR]. Environment: STEPS_TINY (12), STEPS_124M (4),
# SHAPES (default "tiny gpt2-124m"), PEERS (default "1.13:eager 2:fast"; add 2:compile for torch.compile under DDP, whose
# compilation takes minutes on 2 cores), REDUCE_DTYPES (default "fp32 bf16"), ENGINES (default
# "ddp zero2"; any of ddp zero1 zero2 zero3 fsdp).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=run_ranks.sh
source "$repo/scripts/bench/run_ranks.sh"
bench_setup "$repo" "${1:-}"
ranks=2
warmup=2
read -r -a peers <<<"${PEERS:-1.13:eager 2:fast}"
python2=
if [[ " ${peers[*]}" == *" 2:"* ]]; then python2=$("$repo/scripts/bench/torch2_env.sh"); fi

tiny=(model.n_layer=4 model.n_head=4 model.d_model=256 model.vocab_size=256
      model.max_seq_len=256 train.seq_len=128 train.batch_size=16)
gpt2_124m=(model.n_layer=12 model.n_head=12 model.d_model=768 model.vocab_size=50257
           model.max_seq_len=1024 train.seq_len=256 train.batch_size=4)


# dtrain_row LABEL STRATEGY STEPS KEY=VALUE... -> "step_ms exposed_ms"
dtrain_run() {
  local strategy=$1 steps=$2
  shift 2
  local sets=() out=$scratch/out
  for kv in run.out_dir="$out" run.name=overlap run.threads=1 train.steps="$steps" \
            train.warmup_steps=1 train.eval_every=0 logging.sample_tokens=0 train.export_to= \
            train.micro_batch="$micro" parallel.strategy="$strategy" "$@"; do
    sets+=(--set "$kv")
  done
  rm -rf "$out"
  run_ranks "$ranks" "$scratch/dtrain" "$build/dtrain" train "$repo/configs/tiny.yaml" "${sets[@]}"
  step_medians "$out/overlap/metrics.jsonl" "$warmup"
}

# torch_run PEER STEPS KEY=VALUE... -> rank 0's median step_ms
torch_run() {
  local peer=$1 steps=$2 peer_python=$python
  shift 2
  [[ $peer == 2:* ]] && peer_python=$python2
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  run_ranks "$ranks" "$scratch/torch" "$peer_python" "$repo/scripts/bench/torch_ddp_train.py" \
    --data "$data" --threads 1 --steps "$steps" --discard "$warmup" --mode "${peer#*:}" \
    "${sets[@]}"
  sed -n 's/^step_ms=//p' "$scratch/torch.0.log"
}

echo "2 ranks on this machine, 1 thread each; medians over the steps after the first $warmup"
echo "exposed: share of dtrain's step spent waiting on communication (target <= 10%)"
echo "PyTorch DDP (gloo) peers: ${peers[*]} (eager: the reference model as written; fast: fused" \
  "scaled_dot_product_attention and fused AdamW; compile: fast under torch.compile)"
echo "ratio: PyTorch DDP step time / dtrain step time (> 1: dtrain is faster)"
read -r -a reduce_dtypes <<<"${REDUCE_DTYPES:-fp32 bf16}"
read -r -a engines <<<"${ENGINES:-ddp zero2}"
header=$(printf "%-28s %-6s %-6s %12s %12s %9s" shape engine reduce "step ms" "exposed ms" exposed)
for peer in "${peers[@]}"; do header+=$(printf " %19s %7s" "torch $peer ms" ratio); done
echo "$header"
bench() {
  local label=$1 steps=$2
  shift 2
  local torch_ms=() peer
  for peer in "${peers[@]}"; do
    torch_ms+=("$(torch_run "$peer" "$steps" "$@" train.micro_batch="$micro")")
  done
  for strategy in "${engines[@]}"; do
    for reduce in "${reduce_dtypes[@]}"; do
      read -r step_ms exposed_ms <<<"$(dtrain_run "$strategy" "$steps" "$@" \
        parallel.reduce_dtype="$reduce")"
      awk -v l="$label" -v s="$strategy" -v r="$reduce" -v t="$step_ms" -v e="$exposed_ms" \
          -v peers="${torch_ms[*]}" 'BEGIN {
        printf "%-28s %-6s %-6s %12.1f %12.1f %8.1f%%", l, s, r, t, e, 100 * e / t
        n = split(peers, p, " ")
        for (i = 1; i <= n; i++) printf " %19.1f %7.2f", p[i], p[i] / t
        printf "\n" }'
    done
  done
}
shapes=" ${SHAPES:-tiny gpt2-124m} "
if [[ $shapes == *" tiny "* ]]; then
  micro=8
  bench "tiny L4 C256 B16 T128" "${STEPS_TINY:-12}" "${tiny[@]}"
fi
if [[ $shapes == *" gpt2-124m "* ]]; then
  micro=2
  bench "gpt2-124M L12 C768 B4 T256" "${STEPS_124M:-4}" "${gpt2_124m[@]}"
fi
