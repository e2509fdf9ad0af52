#!/usr/bin/env bash
# Streaming throughput of WebDataset shards: `dtrain data inspect --summary` (tar reader, sample
# grouper and token decoding, as training reads them) against the raw read of the same bytes:
# `cat` from the page cache and `curl` from a loopback HTTP server (tests/core/data/
# range_server.py; both sides read from the same server). Target: ratio >= 0.8. dtrain's time
# includes its process start (~15 ms of dynamic linking and library init), cat's and curl's theirs;
# 2 GB by default so that the figure is the streaming rate, not the start (at 512 MB the start
# alone is 15-25% of cat's whole time).
# Usage: scripts/bench/data_throughput.sh [BUILD_DIR] [TOTAL_MB]   (default build, 2048 MB)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
total_mb=${2:-2048}
dtrain=$build/dtrain
work=$(mktemp -d)
server_pid=
cleanup() { [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# 16 shards of token samples (~100 KB each, uint16 tokens), written by Python's tarfile (pax).
/usr/bin/python3 - "$work" "$total_mb" <<'PY'
import io, os, sys, tarfile
out, total = sys.argv[1], int(sys.argv[2]) << 20
shards, sample = 16, 100_000
per_shard = total // shards // sample
payload = os.urandom(sample // 2) * 2  # random token ids below 65536
for s in range(shards):
    with tarfile.open("%s/shard-%02d.tar" % (out, s), "w") as tar:
        for i in range(per_shard):
            info = tarfile.TarInfo("%08d.tokens" % i)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
PY
pattern="$work/shard-{00..15}.tar"
bytes=$(cat "$work"/shard-*.tar | wc -c)
cat "$work"/shard-*.tar > /dev/null  # warm the page cache

# Wall seconds of a command (its stdout discarded).
wall() {
  local start end
  start=$(date +%s.%N); "$@" > /dev/null; end=$(date +%s.%N)
  echo "$start $end" | awk '{ print $2 - $1 }'
}
rounds=5
# Best of $rounds for the peer and for dtrain, run alternately so that both see the same load
# (the machine may be shared): sets peer_s and dtrain_s. Usage: compare PEER... -- DTRAIN...
compare() {
  local peer=() dtrain_cmd=() t
  while [[ $1 != -- ]]; do peer+=("$1"); shift; done
  shift
  dtrain_cmd=("$@")
  peer_s=1e9 dtrain_s=1e9
  for _ in $(seq "$rounds"); do
    t=$(wall "${peer[@]}"); peer_s=$(awk -v a="$t" -v b="$peer_s" 'BEGIN { print (a < b ? a : b) }')
    t=$(wall "${dtrain_cmd[@]}")
    dtrain_s=$(awk -v a="$t" -v b="$dtrain_s" 'BEGIN { print (a < b ? a : b) }')
  done
}

/usr/bin/python3 "$root/tests/core/data/range_server.py" "$work" > "$work/port" &
server_pid=$!
for _ in $(seq 50); do [[ -s $work/port ]] && break; sleep 0.1; done
port=$(head -1 "$work/port")
http_pattern="http://127.0.0.1:$port/shard-{00..15}.tar"
curl_all() { for s in $(seq -w 0 15); do curl -sf "http://127.0.0.1:$port/shard-$s.tar"; done; }

echo "# $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); best of $rounds, alternating"
printf '%-14s %10s %12s %12s %8s\n' source MB peer_MB/s dtrain_MB/s ratio
row() { awk -v n="$1" -v b="$bytes" -v p="$2" -v d="$3" \
  'BEGIN { printf "%-14s %10.0f %12.0f %12.0f %8.2f\n", n, b / 1e6, b / 1e6 / p, b / 1e6 / d, p / d }'; }
compare sh -c "cat $work/shard-*.tar" -- "$dtrain" data inspect --summary "$pattern"
row page-cache "$peer_s" "$dtrain_s"
compare curl_all -- "$dtrain" data inspect --summary "$http_pattern"
row loopback-http "$peer_s" "$dtrain_s"
