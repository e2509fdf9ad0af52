#!/usr/bin/env bash
# Checkpoint throughput: `dtrain ckpt bench` saves parameters + AdamW moments (3 x VALUES floats,
# 124M values = 1.49 GB by default, GPT-2 124M's state) synchronously and asynchronously, and the
# load side reads every chunk back with its CRC32C check (`dtrain ckpt inspect`). The peers are
# `dd` writing the same number of bytes with conv=fsync and reading them back, on the same
# filesystem in the same invocation. Reads are cold (page cache dropped) when this may write
# /proc/sys/vm/drop_caches, else warm on both sides. Each figure is the best of ROUNDS (3)
# alternating rounds. Targets: save and load >= 0.7x dd; time an
# async save blocks training <= 10% of a synchronous save.
# Usage: scripts/bench/ckpt_throughput.sh [BUILD_DIR] [VALUES] [SCRATCH_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
values=${2:-124000000}
dtrain=$build/dtrain
work=$(mktemp -d "${3:-/tmp}/dtrain_ckpt_bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
bytes=$((values * 12))

cache="warm"
drop_caches() {
  sync
  if [[ -w /proc/sys/vm/drop_caches ]] && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
    cache="cold"
  fi
}
seconds() {  # wall seconds of the command
  local start end
  start=$(date +%s.%N); "$@" > /dev/null 2>&1; end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }'
}

mib=$((bytes / 1048576))
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b < a) ? b : a }'; }
get() { sed -E "s/.*$1=([0-9.]+).*/\1/" <<< "$line"; }
# Each side is the best of `rounds` alternating runs: the disk of a shared machine is noisy.
rounds=${ROUNDS:-3}
dd_write= save= dd_read= load= blocked= blocked_first= async_total= staging=
for ((round = 0; round < rounds; round++)); do
  dd_write=$(min "$dd_write" "$(seconds dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mib" conv=fsync)")
  line=$("$dtrain" ckpt bench "$work/ckpt" --values "$values")
  save=$(min "$save" "$(get save_s)"); blocked=$(min "$blocked" "$(get async_blocked_s)")
  blocked_first=$(min "$blocked_first" "$(get async_blocked_first_s)")
  async_total=$(min "$async_total" "$(get async_total_s)")
  staging=$(min "$staging" "$(get staging_alloc_s)")
  drop_caches
  dd_read=$(min "$dd_read" "$(seconds dd if="$work/dd.bin" of=/dev/null bs=1M)")
  drop_caches
  load=$(min "$load" "$(seconds "$dtrain" ckpt inspect "$work/ckpt/step-3")")
  rm -f "$work/dd.bin"
done
dd_bytes=$((mib * 1048576))
awk -v b="$bytes" -v ddb="$dd_bytes" -v s="$save" -v l="$load" -v dw="$dd_write" -v dr="$dd_read" \
    -v bl="$blocked" -v bf="$blocked_first" -v at="$async_total" -v sa="$staging" -v cache="$cache" 'BEGIN {
  gb = 1e9
  printf "%-34s %12s %10s %10s\n", "operation", "bytes", "seconds", "GB/s"
  printf "%-34s %12d %10.3f %10.3f\n", "dd write (conv=fsync)", ddb, dw, ddb / dw / gb
  printf "%-34s %12d %10.3f %10.3f\n", "dtrain save (sync, fsync)", b, s, b / s / gb
  printf "%-34s %12d %10.3f %10.3f\n", "dd read (" cache ")", ddb, dr, ddb / dr / gb
  printf "%-34s %12d %10.3f %10.3f\n", "dtrain load + CRC32C (" cache ")", b, l, b / l / gb
  printf "%-34s %12d %10.4f\n", "async save: training blocked", b, bl
  printf "%-34s %12d %10.4f\n", "async save: blocked, first save", b, bf
  printf "%-34s %12d %10.3f\n", "async save: until durable", b, at
  printf "%-34s %12d %10.3f\n", "async staging memory, at start-up", b, sa
  printf "save / dd write throughput: %.2fx (target >= 0.7)\n", (b / s) / (ddb / dw)
  printf "load / dd read throughput:  %.2fx (target >= 0.7)\n", (b / l) / (ddb / dr)
  printf "async blocked / sync save:  %.3f (target <= 0.10; first save %.3f)\n", bl / s, bf / s
}'
