#!/usr/bin/env bash
# Where a training step's GPU time goes (part of scripts/gpu/check.sh): Nsight Compute times every
# kernel of STEPS steps of GPT-2 124M (B 16, T 1024, the benchmark's shape) at PRECISION, and this
# prints the kernels by their time per step: launches, milliseconds, the mean launch in
# microseconds and the share of all kernels' time. ncu runs the kernels one at a time, with the
# clocks left as they are; the gaps between kernels (launch overhead, host waits) are not in it,
# so the sum is below the step time the benchmark measures. One step by default: a kernel takes
# about the same time every step, and ncu slows each launch down.
# Where ncu is missing, or profiles no kernel while dtrain trains (it cannot read the GPU's
# counters: gVisor, or a container without the permission), this says so and exits 77, as
# check.sh counts a stage that cannot run here.
#
# Usage: scripts/gpu/profile.sh BUILD_DIR [WORK_DIR] (WORK_DIR is written over; default a
# temporary folder). Environment: STEPS (1), PRECISION (bf16), TOP (25 kernels printed), NCU.
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: scripts/gpu/profile.sh BUILD_DIR [WORK_DIR]}
steps=${STEPS:-1}
precision=${PRECISION:-bf16}
top=${TOP:-25}
ncu=${NCU:-$(command -v ncu || find /usr/local/cuda/bin /opt/nvidia -name ncu -type f -print -quit \
  2> /dev/null || true)}
[[ -n $ncu && -x $ncu ]] || { echo "no Nsight Compute (ncu) here: set NCU"; exit 77; }
if [[ -n ${2:-} ]]; then
  work=$2
  rm -rf "$work"
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
# shellcheck source=shapes.sh
source "$repo/scripts/gpu/shapes.sh"
mapfile -t sets < <(set_flags "${gpt2_124m[@]}" run.device=cuda run.precision="$precision" \
  run.out_dir="$work/run" train.steps="$steps" train.warmup_steps=1 train.eval_every=0 \
  logging.sample_tokens=0 train.export_to= checkpoint.save_at_end=false)
status=0
"$ncu" --target-processes all --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum \
  --print-kernel-base function --csv --page raw --log-file "$work/kernels.csv" \
  "$build/dtrain" train "$repo/configs/tiny.yaml" "${sets[@]}" > "$work/train.log" 2>&1 ||
  status=$?
# No kernel profiled while dtrain trained every step: ncu's own lines (==ERROR==, ==WARNING==)
# say why.
if ! grep -qs 'Kernel Name' "$work/kernels.csv" && grep -q "step $steps/$steps" "$work/train.log"
then
  grep -hs '^==\(ERROR\|WARNING\)==' "$work/kernels.csv" "$work/train.log" || true
  echo "Nsight Compute profiled no kernel of a run that trained: it cannot read the GPU's" \
    "counters here"
  exit 77
fi
((status == 0)) || { tail -n 30 "$work/train.log" >&2; exit 1; }
python3 - "$work/kernels.csv" "$steps" "$top" "$precision" <<'EOF'
import collections, csv, sys
path, steps, top, precision = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# ncu's raw page, after its own ==PROF== lines: a header row, a row of units (its ID cell empty),
# then one row per launch; numbers may have thousands separators.
rows = [row for row in csv.reader(open(path)) if row and not row[0].startswith("==")]
start = next(i for i, row in enumerate(rows) if "Kernel Name" in row)
header = rows[start]
name, duration = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
# Units as Nsight Compute spells them: long (nsecond) in older versions, short (ns) in newer.
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1, "second": 1e3,
         "ns": 1e-6, "us": 1e-3, "ms": 1, "s": 1e3}
unit = 1e-6
launches = collections.Counter()
ms = collections.Counter()
for row in rows[start + 1:]:
    if not row[0]:
        unit = scale[row[duration]]
        continue
    launches[row[name]] += 1
    ms[row[name]] += float(row[duration].replace(",", "")) * unit
total = sum(ms.values())
print(f"GPT-2 124M, B 16, T 1024, {precision}: {total / steps:.2f} ms of kernels a step "
      f"({sum(launches.values()) // steps} launches), mean of {steps} step{'s' * (steps > 1)}")
print("| kernel | launches a step | ms a step | mean µs | share |")
print("| --- | --- | --- | --- | --- |")
for kernel, kernel_ms in ms.most_common(top):
    print(f"| {kernel} | {launches[kernel] / steps:g} | {kernel_ms / steps:.3f} "
          f"| {1000 * kernel_ms / launches[kernel]:.1f} | {100 * kernel_ms / total:.1f}% |")
EOF
