#!/usr/bin/env bash
# The GPU tests (part of scripts/gpu/check.sh): dtrain_gpu_tests run one test suite per process,
# each for at most SUITE_TIMEOUT_S (90) seconds, so that a sticky CUDA error (after an illegal
# address every later CUDA call of the process fails) or a hang fails its own suite, not every
# suite after it. Prints one line per suite; on a machine with a GPU a skipped test is a failure.
# With one GPU the tests that need two are left out, saying so.
#
# Usage: scripts/gpu/gpu_tests.sh BUILD_DIR GPUS
set -euo pipefail
shopt -s inherit_errexit
tests=$1/tests/dtrain_gpu_tests
gpus=$2
suite_timeout_s=${SUITE_TIMEOUT_S:-90}
excluded=
if ((gpus < 2)); then
  excluded=NcclCommunicatorTest.TheWatchdogEndsADeviceWaitOnAHungCollective
  excluded+=:NcclCommunicatorTest.RanksThatAllSendFirstMeetTheirPeersReceives
  echo "one GPU: leaving out ${excluded//:/ }"
fi
# The list names each suite unindented ("CudaBackendTest."), its tests indented below it.
list=$(timeout --foreground 60 "$tests" --gtest_list_tests)
mapfile -t suites < <(sed -nE 's/^([A-Za-z0-9_/]+)\.( .*)?$/\1/p' <<< "$list")
((${#suites[@]} > 0)) || { echo "$tests lists no test suite:" >&2; echo "$list" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
for suite in "${suites[@]}"; do
  start=$SECONDS
  status=0
  timeout --foreground -k 5 "$suite_timeout_s" "$tests" --gtest_filter="$suite.*${excluded:+-$excluded}" \
    2>&1 | tee "$log" || status=$?
  passed=$(grep -c '^\[       OK \]' "$log" || true)
  skipped=$(sed -nE 's/^\[  SKIPPED \] ([^ ]+\.[^ ]+).*/\1/p' "$log" | sort -u | xargs)
  broken=$(sed -nE 's/^\[  FAILED  \] ([^ ]+\.[^ ]+).*/\1/p' "$log" | sort -u | xargs)
  if ((status == 124 || status == 137)); then
    outcome="TIMED OUT after $suite_timeout_s s"
  elif ((status != 0)); then
    outcome="FAILED (exit $status${broken:+: $broken})"
  elif [[ -n $skipped ]]; then
    outcome="FAILED: skipped on a machine with a GPU: $skipped"
  else
    outcome=passed
  fi
  [[ $outcome == passed ]] || failed+=("$suite")
  echo "== suite $suite: $outcome ($passed tests passed, $((SECONDS - start)) s)"
done
if ((${#failed[@]} > 0)); then
  echo "GPU test suites failed: ${failed[*]} (of ${#suites[@]})" >&2
  exit 1
fi
echo "GPU test suites: all ${#suites[@]} passed"
