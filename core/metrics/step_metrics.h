// What one training step reports: the step-log line on stderr and one JSON object per step in
// metrics.jsonl, with the same values and units.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/backend/backend.h"

namespace dtrain {

struct StepMetrics {
  int step = 0;  // 1-based: steps done
  int total_steps = 0;
  double time = 0;  // when the step ended, Unix time in seconds (to line up with other logs)
  double loss = 0;  // mean token cross-entropy of the step's batch, nats
  double lr = 0;
  double grad_norm = 0;  // global L2 norm before clipping
  double step_ms = 0;
  double tokens_per_s = 0;
  double mfu_percent = 0;      // model FLOP/s over the stated peak
  double exposed_comm_ms = 0;  // time the step waited on communication (0 on one process)
  double data_wait_ms = 0;     // time the step waited for data (a stall when large)
  // Time this rank's pipeline stage waited on its neighbours' activations and gradients (the
  // bubble as it sees it; parallel.pp > 1 only, else 0).
  double pp_wait_ms = 0;
  // Bytes this rank sent in the step over its data-parallel group, its tensor-parallel group
  // (with the replicated kv heads' subgroup) and its pipeline group; 0 without the group.
  int64_t dp_sent_bytes = 0;
  int64_t tp_sent_bytes = 0;
  int64_t pp_sent_bytes = 0;
  double peak_rss_mib = 0;
  double eta_s = 0;  // the steps left at the mean wall time of a step so far, evaluations and all
  std::optional<double> val_loss;
  // At a step that saved a checkpoint: how long training waited for it (the whole write when
  // synchronous; the copy to staging memory, plus any wait for the previous save, when async).
  std::optional<double> ckpt_blocked_ms;
  // At the first step a resumed run trains: the checkpoint's step it continued from. metrics.jsonl
  // of a resumed run reads as one run (the trainer drops the redone steps' lines), so this is
  // what records a resume there; JSON only, the log says "resumed from" itself.
  std::optional<int64_t> resumed_from_step;
  // At the first step each process trains (a fresh start, a restart, a resumed run): the layout it
  // ran ("zero2 over 4 ranks: dp 4, tp 1, pp 1") and, where dtrain launch's agent or a requeued
  // Slurm job restarted the job, its restarts (WorldMembership::job_restarts; a run launched
  // again to resume has none).
  // JSON only.
  std::string layout;
  std::optional<int64_t> restart;
  // At the first step each process trains, and at a step that raised it: the GFLOP/s per rank
  // that MFU is stated against from that step on (the process's own GEMM, measured at its start,
  // or a step's own speed above it). JSON only.
  std::optional<double> peak_gflops;
  // The step's straggler (core/metrics/stragglers.h), when one rank's compute time lay more than
  // logging.straggler_pct above the ranks' median.
  std::optional<int64_t> straggler_rank;
  std::optional<double> straggler_lag_pct;
  // This rank's training data loader so far (core/data/loader.h ShardCounts); Prometheus only.
  int64_t shards_read = 0;
  int64_t shards_skipped = 0;
};

// "step 12/300 | loss 2.3456 | lr 1.00e-03 | norm 0.81 | 312.5 ms | 6554 tok/s | MFU 41.2% |
//  rss 312 MiB | eta 1m32s | data 0.1 ms", with "| comm 3.1 ms" (exposed communication) and
//  "| pp wait 5.0 ms" (the pipeline stage's wait) when there is any, "| val 2.1" at evaluations,
//  "| ckpt 4.2 ms" at checkpoints and "| straggler rank 3 +25%" when a rank lagged.
std::string FormatStepLine(const StepMetrics& m);
// One line of JSON, no trailing newline.
std::string StepMetricsJson(const StepMetrics& m);
// The inverse of StepMetricsJson (total_steps stays 0: the line does not carry it). An error
// (InvalidArgument) for a line that is not such an object, e.g. one cut short by a killed run.
absl::StatusOr<StepMetrics> ParseStepMetricsJson(std::string_view line);

// Peak resident set size of this process, MiB.
double PeakRssMib();

// The FLOP/s a square GEMM of the run's compute type (`dtype`: float32 at run.matmul_precision,
// or bf16) reaches on this backend, large enough that launching and waiting for it cost little
// (from 1024, doubled until one takes 5 ms, up to 8192: 1024 on most CPUs, 8192 on a GPU; a few
// hundred ms): the peak that MFU is stated against.
double MeasureGemmFlops(Backend& backend, DataType dtype);

// MFU in percent: `rank_flops` (a step's model FLOP/s per rank) over `peak_flops`. No step
// outruns a dense GEMM, so a step above the peak shows that its measurement ran on a busy
// machine: the peak rises to the step's (returns true then; 100%).
double MfuPercent(double rank_flops, double& peak_flops, bool& raised);

}  // namespace dtrain
