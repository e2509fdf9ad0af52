# Sourced by the benchmarks that start local ranks.
#
# bench_setup REPO [BUILD_DIR]: sets build (BUILD_DIR, else REPO/build), python (Debian's, which
# imports python3-torch), data (the demo text) and scratch (a folder removed on exit); exits 1
# naming what to do first when the dtrain binary or the demo text is missing.
bench_setup() {
  build=${2:-$1/build}
  python=/usr/bin/python3
  data=$1/data/fortunes.txt
  [[ -x $build/dtrain ]] || { echo "no dtrain binary in $build; build it first" >&2; exit 1; }
  [[ -f $data ]] || { echo "no $data; run scripts/prepare_demo_data.sh" >&2; exit 1; }
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
}
#
# run_ranks RANKS LOG_PREFIX COMMAND...: one process per rank with torchrun's variables on a
# random loopback port, each writing LOG_PREFIX.<rank>.log; waits for all, and on a failure
# prints every rank's log and exits 1.
run_ranks() {
  local ranks=$1 prefix=$2 port
  shift 2
  port=$((20000 + RANDOM % 20000))
  local pids=()
  for ((rank = 0; rank < ranks; rank++)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$@" >"$prefix.$rank.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { cat "$prefix".*.log >&2; exit 1; }
  done
}
#
# step_medians METRICS_JSONL WARMUP: "step_ms exposed_comm_ms" of a dtrain run, the medians over
# the steps after the first WARMUP.
step_medians() {
  "$python" - "$1" "$2" <<'PY'
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1])][int(sys.argv[2]):]
print(statistics.median(s["step_ms"] for s in steps),
      statistics.median(s["exposed_comm_ms"] for s in steps))
PY
}
