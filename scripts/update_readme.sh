#!/usr/bin/env bash
# Rewrites the recipe reference table in README.md from `dtrain recipe reference`, the single
# source of truth (tests/cli/readme_test.cc fails while the two differ).
set -euo pipefail
cd "$(dirname "$0")/.."
dtrain=${1:-build/dtrain}
table=$("$dtrain" recipe reference)
/usr/bin/python3 - "$table" <<'PY'
import re, sys
begin, end = "<!-- recipe reference begin -->", "<!-- recipe reference end -->"
text = open("README.md").read()
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open("README.md", "w").write(head + begin + "\n" + sys.argv[1].rstrip("\n") + "\n" + end + tail)
PY
