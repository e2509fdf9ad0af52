#!/usr/bin/env bash
# Writes data/fortunes.txt, the demo's real English text (about 2.5 MB), from Debian's
# fortunes package: every cookie file, the "%" separators turned into blank lines.
set -euo pipefail
cd "$(dirname "$0")/.."
src=/usr/share/games/fortunes
out=data/fortunes.txt
if [[ ! -d $src ]]; then
  echo "error: $src is missing; run scripts/setup.sh (it installs the fortunes package)" >&2
  exit 1
fi
mkdir -p data
find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
  xargs -0 cat | sed 's/^%$//' > "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out ($(wc -c < "$out") bytes)"
