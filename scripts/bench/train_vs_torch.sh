#!/usr/bin/env bash
# Training throughput and peak memory of dtrain against an equivalent PyTorch loop
# (scripts/bench/torch_train.py: same model shape, batch, AdamW, clipping, thread count), run
# alternately so machine noise hits all alike. Two PyTorch peers: Debian's 1.13 (OpenBLAS, the
# reference model as written) and PyTorch 2 from PyPI (scripts/bench/torch2_env.sh installs it
# on first use, several GiB) in its best eager settings (fused attention and AdamW) and under
# torch.compile. A benchmark, not a test: it prints, never fails on speed.
#
# Usage: scripts/bench/train_vs_torch.sh [BUILD_DIR]        (default: build/ in the repository)
# Environment: RUNS (3) runs of each program per shape, THREADS (all cores), TINY_STEPS (12),
# GPT2_STEPS (6), SHAPES (default "tiny gpt2-124m"), PEERS (the PyTorch runs, default "1.13:eager 2:fast 2:compile"). The first 2
# steps of every run are warm-up and not timed (torch.compile compiles in them). OPENBLAS_* and
# other environment variables are inherited unchanged by all programs.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build}
dtrain=$build/dtrain
python=/usr/bin/python3  # Debian's, which has python3-torch
runs=${RUNS:-3}
read -r -a peers <<<"${PEERS:-1.13:eager 2:fast 2:compile}"
threads=${THREADS:-$(nproc)}
warmup_steps=2
data=$repo/data/fortunes.txt

[[ -x $dtrain ]] || { echo "no dtrain binary at $dtrain; build it first" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "no /usr/bin/time; install the 'time' package" >&2; exit 1; }
[[ -f $data ]] || { echo "no $data; create the demo data first" >&2; exit 1; }
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "no torch in $python; run scripts/setup.sh" >&2
  exit 1
fi
python2=
if [[ " ${peers[*]}" == *" 2:"* ]]; then python2=$("$repo/scripts/bench/torch2_env.sh"); fi
# peer_python PEER -> the python that runs it ("1.13:..." Debian's, "2:..." PyTorch 2's).
peer_python() { if [[ $1 == 2:* ]]; then echo "$python2"; else echo "$python"; fi; }

# The shapes, as recipe keys that both programs take. The tiny shape restates configs/tiny.yaml
# so that the PyTorch peer cannot drift from it.
tiny=(model.family=gpt2 model.n_layer=4 model.n_head=4 model.d_model=256 model.d_ff=0
      model.vocab_size=256 model.max_seq_len=256 train.seq_len=128 train.batch_size=16
      train.micro_batch=16)
gpt2_124m=(model.family=gpt2 model.n_layer=12 model.n_head=12 model.d_model=768 model.d_ff=0
           model.vocab_size=50257 model.max_seq_len=1024 train.seq_len=256 train.batch_size=4
           train.micro_batch=4)

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

median() {
  "$python" -c 'import sys, statistics; print(statistics.median(map(float, sys.argv[1:])))' "$@"
}

# as_set_args KEY=VALUE... -> the words "--set KEY=VALUE ..." in the array set_args.
as_set_args() {
  set_args=()
  for assignment in "$@"; do set_args+=(--set "$assignment"); done
}

# Runs a command under /usr/bin/time; its stdout and stderr go to $scratch/log. Prints the peak
# RSS in MiB; on failure shows the log and exits.
peak_rss_mib() {
  if ! /usr/bin/time -f %M -o "$scratch/rss" "$@" >"$scratch/log" 2>&1; then
    echo "failed: $*" >&2
    tail -n 30 "$scratch/log" >&2
    exit 1
  fi
  echo $(($(tail -n 1 "$scratch/rss") / 1024))
}

# dtrain_run STEPS KEY=VALUE... -> "tokens_per_s rss_mib": the median tokens_per_s that dtrain
# logs for its steps after the warm-up.
dtrain_run() {
  local steps=$1 out=$scratch/dtrain_out
  shift
  local sets=(run.threads="$threads" run.out_dir="$out" run.name=bench train.steps="$steps"
              train.warmup_steps=1 train.eval_every=0 logging.sample_tokens=0 train.export_to=
              "$@")
  rm -rf "$out"
  as_set_args "${sets[@]}"
  local rss
  rss=$(peak_rss_mib "$dtrain" train "$repo/configs/tiny.yaml" "${set_args[@]}")
  local tokens_per_s
  tokens_per_s=$("$python" - "$out/bench/metrics.jsonl" "$warmup_steps" <<'EOF'
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(statistics.median(step["tokens_per_s"] for step in steps[int(sys.argv[2]):]))
EOF
)
  echo "$tokens_per_s $rss"
}

# torch_run PEER STEPS KEY=VALUE... -> "tokens_per_s rss_mib flops_per_token"
torch_run() {
  local peer=$1 steps=$2
  shift 2
  as_set_args "$@"
  local rss
  rss=$(peak_rss_mib "$(peer_python "$peer")" "$repo/scripts/bench/torch_train.py" \
        --data "$data" --threads "$threads" --steps "$steps" --discard "$warmup_steps" \
        --mode "${peer#*:}" "${set_args[@]}")
  # The last line is "tokens_per_s=X flops_per_token=Y".
  local result
  result=$(tail -n 1 "$scratch/log")
  local tokens_per_s=${result#tokens_per_s=}
  echo "${tokens_per_s%% *} $rss ${result##*flops_per_token=}"
}

# bench LABEL STEPS KEY=VALUE...: RUNS alternating runs of dtrain and each peer; prints one table
# row per peer, each against the same dtrain median.
bench() {
  local label=$1 steps=$2
  shift 2
  local d_tps=() d_rss=() result tps rss flops_per_token peer
  declare -A t_tps=() t_rss=()
  for ((run = 0; run < runs; run++)); do
    result=$(dtrain_run "$steps" "$@")
    read -r tps rss <<<"$result"
    d_tps+=("$tps") d_rss+=("$rss")
    for peer in "${peers[@]}"; do
      result=$(torch_run "$peer" "$steps" "$@")
      read -r tps rss flops_per_token <<<"$result"
      t_tps[$peer]+=" $tps" t_rss[$peer]+=" $rss"
    done
  done
  local d t
  d=$(median "${d_tps[@]}")
  for peer in "${peers[@]}"; do
    # shellcheck disable=SC2086  # the space-separated runs of this peer
    t=$(median ${t_tps[$peer]})
    # shellcheck disable=SC2086
    awk -v label="$label" -v peer="${versions[$peer]} ${peer#*:}" -v d="$d" -v t="$t" \
        -v flops="$flops_per_token" -v d_rss="$(median "${d_rss[@]}")" \
        -v t_rss="$(median ${t_rss[$peer]})" -v sgemm="${sgemm#gflops=}" 'BEGIN {
      printf "%-26s %-21s %12.0f %12.0f %7.2f %12.1f %12.1f %8.0f%% %10.0f %10.0f\n",
             label, peer, d, t, d / t, d * flops / 1e9, t * flops / 1e9,
             100 * d * flops / 1e9 / sgemm, d_rss, t_rss }'
  done
}

sgemm=$("$python" "$repo/scripts/bench/torch_sgemm.py" --threads "$threads")
declare -A versions=()
for peer in "${peers[@]}"; do
  versions[$peer]=$("$(peer_python "$peer")" -c 'import torch; print(torch.__version__)')
done
echo "dtrain vs PyTorch (${peers[*]}), $threads threads, median of $runs alternating runs," \
  "first $warmup_steps steps of each run untimed"
echo "reference: one 2048^3 float32 torch.mm in Debian's PyTorch" \
  "$("$python" -c 'import torch; print(torch.__version__)') (OpenBLAS) = ${sgemm#gflops=} GFLOP/s"
# The GEMM kernel OpenBLAS picked (both sides load the same library with the same environment).
echo "OpenBLAS kernel, both sides: $("$python" -c 'import ctypes, ctypes.util
get = ctypes.CDLL(ctypes.util.find_library("openblas")).openblas_get_corename
get.restype = ctypes.c_char_p
print(get().decode())') (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
if [[ -n $python2 ]]; then
  echo "PyTorch 2's own (its BLAS): $("$python2" "$repo/scripts/bench/torch_sgemm.py" \
    --threads "$threads")"
fi
echo
echo "peer: PyTorch version and mode (eager: the reference model as written; fast: fused" \
  "scaled_dot_product_attention and fused AdamW; compile: fast under torch.compile)"
echo "tok/s: training tokens per second; ratio: dtrain tok/s / torch tok/s"
echo "GF/s: model GFLOP/s = FLOPs per token (6N + 6LTC, N = parameters except" \
  "position embeddings) x tok/s"
echo "of sgemm: dtrain GF/s / the reference GEMM's GF/s"
echo "RSS MiB: peak resident memory of the whole process (/usr/bin/time %M)"
printf "%-26s %-21s %12s %12s %7s %12s %12s %9s %10s %10s\n" shape peer "dtrain tok/s" \
  "torch tok/s" ratio "dtrain GF/s" "torch GF/s" "of sgemm" "dtrain RSS" "torch RSS"
shapes=" ${SHAPES:-tiny gpt2-124m} "
if [[ $shapes == *" tiny "* ]]; then
  bench "tiny L4 C256 B16 T128" "${TINY_STEPS:-12}" "${tiny[@]}"
fi
if [[ $shapes == *" gpt2-124m "* ]]; then
  bench "gpt2-124M L12 C768 B4 T256" "${GPT2_STEPS:-6}" "${gpt2_124m[@]}"
fi
