#!/usr/bin/env bash
# Tokenizer encoding throughput: `dtrain data encode` against Hugging Face tokenizers (the Rust
# library behind transformers' fast tokenizers) on the same file with the same threads. Both
# tokenizers are trained by tokenizers' own trainer on the demo text (GPT-2 style and Llama 3
# style byte-level BPE, VOCAB ids); the input is the demo text repeated to about MB megabytes.
# dtrain encodes the file as one text (cut at line starts for its threads); tokenizers runs
# encode_batch over the file's lines on as many rayon threads, its fast path. Only encoding is
# timed, best of ROUNDS (3). Token counts are printed: encoding line by line cuts pieces at every
# line end (a blank-line run "\n\n" becomes two tokens), so tokenizers' count is a little
# higher; the ids of whole texts are equal (tests/reference/test_tokenizer_parity.py). Goal:
# dtrain faster (ratio > 1).
# Usage: scripts/bench/tokenizer_throughput.sh [BUILD_DIR] [THREADS...]   (default: 1 and nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
shift || true
threads_list=("$@")
((${#threads_list[@]})) || threads_list=(1 "$(nproc)")
dtrain=$build/dtrain
python=$(bash "$root/scripts/python_env.sh")
work=$(mktemp -d /tmp/dtrain_tok_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
[[ -f $root/data/fortunes.txt ]] || bash "$root/scripts/prepare_demo_data.sh" > /dev/null
mb=${MB:-20}
vocab=${VOCAB:-32000}
rounds=${ROUNDS:-3}
# Valid UTF-8 for both sides (Python reads the file as text).
iconv -c -f utf-8 -t utf-8 "$root/data/fortunes.txt" > "$work/one.txt" || true
while (($(stat -c %s "$work/input.txt" 2> /dev/null || echo 0) < mb * 1000000)); do
  cat "$work/one.txt" >> "$work/input.txt"
done
"$python" "$root/scripts/bench/tokenizer_peer.py" train "$work/one.txt" "$work/tok" "$vocab"
bytes=$(stat -c %s "$work/input.txt")

printf "%-8s %8s %10s %12s %12s %8s  %s\n" tokenizer threads tokens "dtrain MB/s" "HF MB/s" ratio "counts"
for kind in gpt2 llama3; do
  json=$work/tok/$kind/tokenizer.json
  for threads in "${threads_list[@]}"; do
    best_d= best_h= tokens_d= tokens_h=
    for ((round = 0; round < rounds; round++)); do
      line=$("$dtrain" data encode --summary --threads "$threads" --tokenizer "$json" "$work/input.txt")
      s=$(sed -E 's/.* tokens in ([0-9.]+) s.*/\1/' <<< "$line")
      tokens_d=$(sed -E 's/^[0-9]+ bytes, ([0-9]+) tokens.*/\1/' <<< "$line")
      best_d=$(awk -v a="$best_d" -v b="$s" 'BEGIN { print (a == "" || b < a) ? b : a }')
      line=$(RAYON_NUM_THREADS=$threads RAYON_RS_NUM_CPUS=$threads \
        "$python" "$root/scripts/bench/tokenizer_peer.py" encode "$json" "$work/input.txt")
      s=$(sed -E 's/.*seconds=([0-9.]+).*/\1/' <<< "$line")
      tokens_h=$(sed -E 's/tokens=([0-9]+).*/\1/' <<< "$line")
      best_h=$(awk -v a="$best_h" -v b="$s" 'BEGIN { print (a == "" || b < a) ? b : a }')
    done
    same=$([[ $tokens_d == "$tokens_h" ]] && echo "same" || echo "tokenizers: $tokens_h tokens")
    awk -v k="$kind" -v t="$threads" -v n="$tokens_d" -v b="$bytes" -v d="$best_d" -v h="$best_h" -v s="$same" 'BEGIN {
      printf "%-8s %8d %10d %12.1f %12.1f %8.2f  %s\n", k, t, n, b / d / 1e6, b / h / 1e6, h / d, s }'
  done
done
echo "input: $bytes bytes (demo text repeated), vocabulary $vocab; best of $rounds rounds"
