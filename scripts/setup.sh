#!/usr/bin/env bash
# Installs every Debian package that building dtrain, running its demo and its tests need.
# Idempotent; safe to run again.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git time
  libyaml-cpp-dev libcli11-dev libabsl-dev libcurl4-openssl-dev libssl-dev
  libopenblas-dev libgloo-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  libcpp-httplib-dev  # the HTTP server behind logging.metrics_port's /metrics
  libpcre2-dev libsentencepiece-dev libicu-dev  # model tokenizers: split regexes,
                                                 # SentencePiece models, NFKC
  prometheus          # the real Prometheus server and promtool: tests of the /metrics exposition
  fortunes            # the demo's real English text: /usr/share/games/fortunes
  python3 python3-torch python3-numpy  # the PyTorch reference and peer (tests, benchmarks)
  python3-yaml        # tests/integration/k8s_manifests_test.py reads the Kubernetes manifests
  clang               # libFuzzer for tests/fuzz (DTRAIN_FUZZ=ON)
  slurmctld slurmd slurm-client munge  # Slurm test cluster: scripts/slurm/cluster.sh
  iproute2            # network namespaces: tests/integration/store_lost_host_test.cc
  chromium            # headless rendering of `dtrain report` pages: tests/cli/report_command_test.cc
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi
