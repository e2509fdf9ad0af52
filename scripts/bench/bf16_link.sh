#!/usr/bin/env bash
# What bf16 on the wire buys where the link is the bottleneck: 2 ranks in two network namespaces
# joined by a veth pair shaped to RATE each way (tc tbf), DDP, ZeRO-2 and ZeRO-3 three ways: all
# float32; gradients reduced in bf16 (parallel.reduce_dtype: bf16); bf16 parameters, gathered in
# bf16, with their gradients (run.precision: bf16). The step time, the share of it spent waiting
# on communication, and the speed-ups over float32. (On loopback, scripts/bench/ddp_overlap.sh,
# the link is never the bottleneck and bf16 only adds its rounding and Gloo's bf16 arithmetic.)
# PyTorch 1.13 DDP cannot be the peer: its Gloo refuses bf16 all-reduces ("Invalid scalar type").
# Needs root (ip netns, tc, unshare). A benchmark, not a test: it prints, never fails on speed.
#
# Usage: scripts/bench/bf16_link.sh [BUILD_DIR]. Environment: RATE (1gbit), STEPS (6),
# SHAPES (default "tiny gpt2-124m").
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=run_ranks.sh
source "$repo/scripts/bench/run_ranks.sh"
bench_setup "$repo" "${1:-}"
rate=${RATE:-1gbit}
steps=${STEPS:-6}
warmup=2
suffix=$$
namespaces=("dtrain-rd0-$suffix" "dtrain-rd1-$suffix")
addresses=(10.231.0.1 10.231.0.2)
cleanup() {
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2> /dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT
for ns in "${namespaces[@]}"; do ip netns add "$ns"; done
ip link add "rd0-$suffix" netns "${namespaces[0]}" type veth peer name "rd1-$suffix" \
  netns "${namespaces[1]}"
for i in 0 1; do
  ns=${namespaces[$i]}
  ip -n "$ns" addr add "${addresses[$i]}/24" dev "rd$i-$suffix"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "rd$i-$suffix" up
  ip netns exec "$ns" tc qdisc add dev "rd$i-$suffix" root tbf rate "$rate" burst 256kb \
    latency 100ms
done

tiny=(model.n_layer=4 model.n_head=4 model.d_model=256 model.vocab_size=256
  model.max_seq_len=256 train.seq_len=128 train.batch_size=16 train.micro_batch=8)
gpt2_124m=(model.n_layer=12 model.n_head=12 model.d_model=768 model.vocab_size=50257
  model.max_seq_len=1024 train.seq_len=256 train.batch_size=4 train.micro_batch=2)

# run STRATEGY PRECISION REDUCE KEY=VALUE...: "step_ms exposed_ms", medians after the warm-up
# steps, into $scratch/result. Each rank runs in its namespace under its own host name, its
# address, which Gloo's peers dial; the store takes them with the job's token.
run() {
  local strategy=$1 precision=$2 reduce=$3 out=$scratch/out pids=() rank
  shift 3
  local sets=()
  for kv in run.out_dir="$out" run.name=link run.threads=1 train.steps="$steps" \
    train.warmup_steps=1 train.eval_every=0 logging.sample_tokens=0 train.export_to= \
    run.precision="$precision" parallel.strategy="$strategy" parallel.reduce_dtype="$reduce" \
    "$@"; do
    sets+=(--set "$kv")
  done
  rm -rf "$out"
  for rank in 0 1; do
    local environment="RANK=$rank LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=${addresses[0]}"
    environment+=" MASTER_PORT=29500 DTRAIN_RDZV_TOKEN=bench-$suffix"
    ip netns exec "${namespaces[$rank]}" unshare --uts \
      sh -c "hostname ${addresses[$rank]} && exec env $environment \"\$@\"" sh \
      "$build/dtrain" train "$repo/configs/tiny.yaml" "${sets[@]}" > "$scratch/link.$rank.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$scratch"/link.*.log >&2; exit 1; }; done
  step_medians "$out/link/metrics.jsonl" "$warmup" > "$scratch/result"
}

echo "2 ranks in two network namespaces over a $rate link each way (tc tbf), 1 thread each;" \
  "medians over the steps after the first $warmup of $steps"
printf "%-33s %17s %24s %24s\n" "" "all fp32" "bf16 gradients" "bf16 params + grads"
printf "%-26s %-6s %8s %8s %8s %8s %6s %8s %8s %6s\n" shape engine "step ms" exposed "step ms" \
  exposed x "step ms" exposed x
bench() {
  local label=$1 strategy
  shift
  for strategy in ddp zero2 zero3; do
    run "$strategy" fp32 fp32 "$@"
    read -r fp32_ms fp32_exposed < "$scratch/result"
    run "$strategy" fp32 bf16 "$@"
    read -r grads_ms grads_exposed < "$scratch/result"
    run "$strategy" bf16 bf16 "$@"
    read -r params_ms params_exposed < "$scratch/result"
    awk -v l="$label" -v s="$strategy" -v a="$fp32_ms" -v ae="$fp32_exposed" -v g="$grads_ms" \
      -v ge="$grads_exposed" -v p="$params_ms" -v pe="$params_exposed" 'BEGIN {
      printf "%-26s %-6s %8.1f %8.1f %8.1f %8.1f %6.2f %8.1f %8.1f %6.2f\n",
        l, s, a, ae, g, ge, a / g, p, pe, a / p }'
  done
}
shapes=" ${SHAPES:-tiny gpt2-124m} "
if [[ $shapes == *" tiny "* ]]; then bench "tiny L4 C256 B16 T128" "${tiny[@]}"; fi
if [[ $shapes == *" gpt2-124m "* ]]; then bench "gpt2-124M L12 C768 B4 T256" "${gpt2_124m[@]}"; fi
