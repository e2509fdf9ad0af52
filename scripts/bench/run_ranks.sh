# Sourced by the benchmarks that start local ranks.
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
