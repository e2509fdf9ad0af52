#!/usr/bin/env bash
# Pipeline bubble on local ranks (1 thread each): every stage's measured idle share against
# the theory, for pp 2 and 4, each schedule the trainer runs, at m = p, 2p and 4p micro-batches;
# and the activations each stage held against the start-up estimate that sized them.
#
# Measured, per stage, summed over the steps after the first (the trainer's end-of-run line
# "pipeline stage S of P: waited W ms of T ms ... computing C ms"): T is the wall time of the
# stage's pipelined part of the step, C its forwards and backwards, W the time it blocked on its
# neighbours inside T. The stages start that part together, up to their own optimizer steps (the
# previous step ends in all-reduces over the pipeline), and stage 0 ends it last (its last
# backward needs every other stage's), so the longest T, stage 0's, is the pipeline's span S,
# and a stage's idle time is S - C: the fill it waits through at the start of its part (in W)
# and the drain after its part ends (outside W: the last stage is done while the others still
# run their last backwards). Theory, for uniform stages:
#   idle       (S - C) / S  against (p - 1) / (v m + p - 1), the bubble's share of the span;
#   idle/busy  (S - C) / C  against (p - 1) / (v m), the bubble over the ideal time (Narayanan et
#              al. 2021; the issue's formula; 1F1B and GPipe alike, interleaving divides by v);
#   wait       W / S: the part of the idle a stage spends blocked in its own part of the step
#              (metrics.jsonl's pp_wait_ms is stage 0's W per step).
# Measured differs from theory: the stages are not uniform (the stage assignment balances
# FLOPs; the embedding, the head and the loss cost more than their FLOPs say), transfers are not
# free, and with more ranks than cores the stages share CPUs.
# Activations: "act MiB" is what the micro-batches the stage held at once need in the model's
# arena plus the executor's send and receive buffers at their peak; "estimate" is what the
# trainer's start-up estimate (EstimateRankMemory, PipelineActivationSlots) sized.
# A benchmark, not a test: it prints, never fails.
#
# Each layout runs REPEATS times; the table shows the run with the shortest span (a busy machine
# only ever slows a run, and a stage slowed by another process shows as its neighbours' idle).
#
# Usage: scripts/bench/pipeline_bubble.sh [BUILD_DIR]. Environment: STEPS (6; the first is not
# counted), REPEATS (2), STAGES ("2 4"), SCHEDULES ("1f1b gpipe interleaved").
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too
repo=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=run_ranks.sh
source "$repo/scripts/bench/run_ranks.sh"
bench_setup "$repo" "${1:-}"
steps=${STEPS:-6}
repeats=${REPEATS:-2}
stage_counts=${STAGES:-2 4}
schedules=${SCHEDULES:-1f1b gpipe interleaved}
micro=4
virtual=2  # interleaved's chunks per stage

# 8 blocks, so that 4 stages hold 2 each; byte vocabulary, so that the head is a small share.
model=(model.family=gpt2 model.n_layer=8 model.n_head=4 model.d_model=128 model.vocab_size=256
       model.max_seq_len=64 train.seq_len=64 "train.micro_batch=$micro")


# pipeline_run P SCHEDULE V M: trains, then prints one row per stage; or, when the trainer
# refuses the layout, one line saying so with its message.
pipeline_run() {
  local p=$1 schedule=$2 v=$3 m=$4
  local name=pp${p}_${schedule}_m$m out=$scratch/out sets=()
  for kv in run.out_dir="$out" run.name="$name" run.threads=1 train.steps="$steps" \
            train.warmup_steps=1 train.eval_every=0 logging.sample_tokens=0 train.export_to= \
            checkpoint.interval=0 checkpoint.resume=never "${model[@]}" \
            train.batch_size=$((m * micro)) parallel.pp="$p" parallel.pp_schedule="$schedule" \
            parallel.pp_virtual_stages="$v"; do
    sets+=(--set "$kv")
  done
  local k
  for ((k = 0; k < repeats; k++)); do
    if ! (run_ranks "$p" "$scratch/$name.$k" "$build/dtrain" train "$repo/configs/tiny.yaml" \
            "${sets[@]}" 2>/dev/null); then
      local why
      why=$(grep -h -m 1 -o 'error: .*' "$scratch/$name.$k".*.log | head -n 1 || true)
      printf "%-4s %-11s %2s %3s  not runnable: %s\n" "$p" "$schedule" "$v" "$m" \
        "${why:-see the rank logs}"
      return
    fi
  done
  "$python" - "$p" "$schedule" "$v" "$m" "$repeats" "$scratch/$name" <<'PY'
import glob, re, sys
p, schedule, v, m, repeats = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                              int(sys.argv[5]))
line = re.compile(
    r"pipeline stage (\d+) of \d+: waited ([\d.]+) ms of ([\d.]+) ms .*"
    r"computing ([\d.]+) ms; activations: at most (\d+) micro-batch(?:es| chunks) in flight in (\d+) "
    r"slots, ([\d.]+) MiB \(the estimate: ([\d.]+) MiB\), plus ([\d.]+) MiB")
runs = []
for k in range(repeats):
    stages = {}
    for path in glob.glob(f"{sys.argv[6]}.{k}.*.log"):
        for text in open(path, errors="replace"):
            if found := line.search(text):
                stages[int(found[1])] = [float(x) for x in found.groups()[1:]]
    if len(stages) != p:
        print(f"{p:<4} {schedule:<11} {v:>2} {m:>3}  run {k}: no summary line from stages "
              f"{sorted(set(range(p)) - set(stages))}")
        sys.exit()
    runs.append(stages)
# The run with the shortest span: a busy machine only ever slows a run.
stages = min(runs, key=lambda run: max(row[1] for row in run.values()))
span = max(row[1] for row in stages.values())
theory_span = (p - 1) / (v * m + p - 1)
theory_busy = (p - 1) / (v * m)
for stage, (wait, _, compute, held, slots, held_mib, estimate_mib, buffers_mib) in \
        sorted(stages.items()):
    idle = span - compute
    print(f"{p:<4} {schedule:<11} {v:>2} {m:>3} {stage:>5} {100 * idle / span:>6.1f}% "
          f"{100 * theory_span:>6.1f}% {100 * idle / compute:>9.1f}% {100 * theory_busy:>6.1f}% "
          f"{100 * wait / span:>6.1f}% {int(held):>5}/{int(slots):<4} "
          f"{held_mib + buffers_mib:>8.2f} {estimate_mib:>8.2f}")
PY
}

echo "GPT-2 shape L8 C128 H4, vocab 256, micro-batches of $micro x 64 tokens; sums over the"
echo "$((steps - 1)) steps after the first, best of $repeats runs; $(nproc) cores for up to 4 ranks of 1"
echo "thread each"
echo "(ranks beyond the cores share them, which shows as idle time); columns: see the script"
printf "%-4s %-11s %2s %3s %5s %7s %7s %10s %7s %7s %10s %8s %8s\n" pp schedule v m stage idle \
  theory idle/busy theory wait held/slots "act MiB" estimate
for p in $stage_counts; do
  for schedule in $schedules; do
    v=1
    [[ $schedule == interleaved ]] && v=$virtual
    for m in "$p" $((2 * p)) $((4 * p)); do
      pipeline_run "$p" "$schedule" "$v" "$m"
    done
  done
done

# The planner's assumptions line names the recipe's schedule.
for schedule in $schedules; do
  v=1
  [[ $schedule == interleaved ]] && v=$virtual
  plan=$("$build/dtrain" plan "$repo/configs/tiny.yaml" --set parallel.pp=2 \
    --set parallel.pp_schedule="$schedule" --set parallel.pp_virtual_stages="$v" \
    --set train.micro_batch=8 2>&1 || true)
  echo "dtrain plan, parallel.pp=2 pp_schedule=$schedule pp_virtual_stages=$v:" \
    "$(grep -m 1 -e '^Assumptions: ' -e '^error: ' <<<"$plan" || echo "no assumptions line")"
done
