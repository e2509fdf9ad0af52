#!/usr/bin/env bash
# All-reduce bus bandwidth of `dtrain bench comm` (Gloo backend) against Gloo's own
# gloo::allreduce (scripts/bench/raw_gloo_allreduce.cc) on 2 local processes, same sizes, run
# alternately so machine noise hits both alike. A benchmark, not a test: it prints, never fails
# on speed.
#
# Usage: scripts/bench/comm_vs_gloo.sh [BUILD_DIR]        (default: build/ in the repository)
# Environment: RUNS (5) alternating runs of each program, ITERS (200) timed all-reduces per size,
# MIN_BYTES (1M), MAX_BYTES (64M) in bytes or with a K/M suffix, PORT (29650) first port used.
set -euo pipefail
shopt -s inherit_errexit

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build}
dtrain=$build/dtrain
runs=${RUNS:-5}
iters=${ITERS:-200}
port=${PORT:-29650}
world=2

to_bytes() {
  local v=$1
  case $v in
    *K) echo $((${v%K} << 10)) ;;
    *M) echo $((${v%M} << 20)) ;;
    *G) echo $((${v%G} << 30)) ;;
    *) echo "$v" ;;
  esac
}
min_bytes=$(to_bytes "${MIN_BYTES:-1M}")
max_bytes=$(to_bytes "${MAX_BYTES:-64M}")

[[ -x $dtrain ]] || { echo "no dtrain binary at $dtrain; build it first" >&2; exit 1; }
[[ -d /usr/include/gloo ]] || { echo "no Gloo headers; install libgloo-dev" >&2; exit 1; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
g++ -std=c++17 -O3 -march=native "$repo/scripts/bench/raw_gloo_allreduce.cc" \
  -o "$scratch/raw_gloo_allreduce" -lgloo -lpthread

# run_ranks OUT FUNCTION: FUNCTION on $world local processes; rank 0's stdout goes to OUT.
run_ranks() {
  local out=$1
  shift
  local pids=() rank
  for ((rank = 0; rank < world; rank++)); do
    RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$@" "$rank" >"$scratch/rank$rank.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if ((failed)); then
    echo "failed: $*" >&2
    tail -n 20 "$scratch"/rank*.log >&2
    exit 1
  fi
  cp "$scratch/rank0.log" "$out"
  port=$((port + 1))  # a fresh port per run: the last one may linger in TIME_WAIT
}

# The ranks: shell functions that run_ranks starts in the background with the rank appended.
dtrain_rank() {  # dtrain reads its rank from RANK
  "$dtrain" bench comm --ops all_reduce --min-bytes "$min_bytes" \
    --max-bytes "$max_bytes" --iters "$iters"
}
gloo_rank() {
  mkdir -p "$scratch/store.$port"
  "$scratch/raw_gloo_allreduce" "$1" "$world" "$scratch/store.$port" "$min_bytes" "$max_bytes" \
    "$iters"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((run = 0; run < runs; run++)); do
  run_ranks "$scratch/dtrain.$run" dtrain_rank
  awk '$1 == "all_reduce" { print $2, $6 }' "$scratch/dtrain.$run" >"$scratch/d.$run"
  run_ranks "$scratch/gloo.$run" gloo_rank
  awk 'NF == 3 { print $1, $3 }' "$scratch/gloo.$run" >"$scratch/g.$run"
done

echo "all_reduce float32 sum, $world local processes, median of $runs alternating runs," \
  "$iters timed operations per size"
echo "busbw GB/s = bytes / time x 2(n-1)/n (nccl-tests); ratio = dtrain / gloo (medians);" \
  "min-max = the spread over the runs"
echo "load average (1, 5, 15 min): $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after" \
  "on $(nproc) CPUs"
printf "%12s %14s %15s %14s %15s %7s\n" bytes "dtrain busbw" "min-max" "gloo busbw" "min-max" ratio
python3 - "$scratch" "$runs" <<'PY'
import statistics, sys
scratch, runs = sys.argv[1], int(sys.argv[2])
def load(prefix):
    table = {}
    for run in range(runs):
        for line in open(f"{scratch}/{prefix}.{run}"):
            size, busbw = line.split()
            table.setdefault(int(size), []).append(float(busbw))
    return table
nan = float("nan")
dtrain, gloo = load("d"), load("g")
for size in sorted(dtrain):
    d, g = dtrain[size], gloo.get(size, [nan])
    spread = lambda v: f"{min(v):.3f}-{max(v):.3f}"
    dm, gm = statistics.median(d), statistics.median(g)
    print(f"{size:12d} {dm:14.3f} {spread(d):>15} {gm:14.3f} {spread(g):>15} {dm / gm:7.2f}")
PY
