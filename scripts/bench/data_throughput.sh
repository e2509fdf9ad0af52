#!/usr/bin/env bash
# Streaming throughput of WebDataset shards: `dtrain data inspect --summary` (tar reader, sample
# grouper and token decoding, as training reads them) against the raw read of the same bytes:
# `cat` from the page cache and `curl` from a loopback HTTP server (tests/core/data/
# range_server.py; both sides read from the same server). Target: ratio >= 0.8.
# Usage: scripts/bench/data_throughput.sh [BUILD_DIR] [TOTAL_MB]   (default build, 512 MB)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
total_mb=${2:-512}
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

seconds() {  # wall seconds of the command, best of 3
  local best=
  for _ in 1 2 3; do
    local start end
    start=$(date +%s.%N); "$@" > /dev/null; end=$(date +%s.%N)
    best=$(echo "$start $end ${best:-1e9}" | awk '{t = $2 - $1; print (t < $3 ? t : $3)}')
  done
  echo "$best"
}

/usr/bin/python3 "$root/tests/core/data/range_server.py" "$work" > "$work/port" &
server_pid=$!
for _ in $(seq 50); do [[ -s $work/port ]] && break; sleep 0.1; done
port=$(head -1 "$work/port")
http_pattern="http://127.0.0.1:$port/shard-{00..15}.tar"
curl_all() { for s in $(seq -w 0 15); do curl -sf "http://127.0.0.1:$port/shard-$s.tar"; done; }

cat_s=$(seconds sh -c "cat $work/shard-*.tar")
dtrain_s=$(seconds "$dtrain" data inspect --summary "$pattern")
curl_s=$(seconds curl_all)
dtrain_http_s=$(seconds "$dtrain" data inspect --summary "$http_pattern")

printf '%-14s %10s %12s %12s %8s\n' source MB peer_MB/s dtrain_MB/s ratio
row() { awk -v n="$1" -v b="$bytes" -v p="$2" -v d="$3" \
  'BEGIN { printf "%-14s %10.0f %12.0f %12.0f %8.2f\n", n, b / 1e6, b / 1e6 / p, b / 1e6 / d, p / d }'; }
row page-cache "$cat_s" "$dtrain_s"
row loopback-http "$curl_s" "$dtrain_http_s"
