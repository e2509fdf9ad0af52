// The search: every layout the cluster can run, estimated, filtered by memory and ranked.
//
// Enumerates (strategy, tp, pp and its schedule, dp, micro-batch, recomputation, offload), rejects
// layouts that do not divide the cluster, model or batch and those over the memory limit (each with
// its reason), ranks the rest by estimated step time and recommends the simplest layout within a
// few percent of the fastest; one with optimizer offload, which the trainer does not run yet, only
// when nothing fits without it. Pure and thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/planner/catalog.h"
#include "parallel/planner/cost_model.h"

namespace dtrain {

struct SearchOptions {
  // zero3 is left out by default: it costs exactly what fsdp costs (the same sharding), so the
  // search lists that family once, as fsdp.
  std::vector<Strategy> strategies = {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2,
                                      Strategy::kFsdp};
  int max_tp = 0;  // 0 = gpus_per_node (tensor parallelism stays inside a node)
  int max_pp = 0;  // 0 = n_layer
  // Schedules tried for pp > 1. 1F1B alone by default: GPipe has the same bubble and holds every
  // micro-batch in flight instead of at most pp, so it never costs less.
  std::vector<PipelineSchedule> pp_schedules = {PipelineSchedule::kOneFOneB};
  int pp_virtual_stages = 2;  // model chunks per stage under the interleaved schedule
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  bool allow_offload = true;
  bool allow_sequence_parallel = true;  // with tp > 1; it only saves memory in this model
  double memory_margin = 0.10;          // share of GPU memory kept free (fragmentation, spikes)
  double simpler_within = 0.03;  // a simpler layout this much slower is still preferred (inf: any)
  // ... or this many ms a step slower: below what the estimates resolve (a few kernels' launches,
  // a collective's latency), so a small model's step of a fraction of a ms gets no pipeline
  // stages for a few hundredths of one.
  double simpler_within_ms = 0.1;
  CostAssumptions assumptions;
};

enum class Verdict {
  kRecommended,
  kFits,        // runs, but slower or no simpler than the recommendation
  kOverMemory,  // estimated, over the memory limit
  kInvalid,     // does not divide the cluster, model or batch; no estimate
};

struct Candidate {
  Layout layout;
  Estimate estimate;  // empty for kInvalid
  Verdict verdict = Verdict::kInvalid;
  std::string reason;  // why it is not the recommendation; for the recommendation, why it is
};

struct Plan {
  Workload workload;
  ClusterSpec cluster;
  SearchOptions options;
  std::vector<Candidate> candidates;  // estimated ones by step time, then the invalid ones
  int recommended = -1;               // index into candidates; -1 when no layout fits
  double usable_gib = 0;              // per GPU, after the margin
  double search_ms = 0;               // wall time of the search
  // The recipe's own layout (RecipeLayout), which `dtrain plan` shows beside the recommendation.
  std::optional<Layout> recipe_layout;

  const Candidate* recommendation() const {
    return recommended < 0 ? nullptr : &candidates[recommended];
  }
};

// Why `layout` cannot run `workload` on `cluster` (InvalidArgument), or OK.
absl::Status CheckLayout(const Workload& workload, const ClusterSpec& cluster,
                         const Layout& layout);

// Searches every layout of `cluster.world_size()` ranks. Errors only when the workload or
// cluster itself is unusable (InvalidArgument naming the recipe key); "nothing fits" is a plan
// without a recommendation, whose candidates say why.
absl::StatusOr<Plan> SearchLayouts(const Workload& workload, const ClusterSpec& cluster,
                                   const SearchOptions& options = {});

// Why `plan` recommends nothing: FailedPrecondition naming the memory every valid layout
// exceeds, or, when none is valid, each distinct reason the layouts do not split.
absl::Status WhyNoLayout(const Plan& plan);

// Where the batch keeps `plan`'s recommendation from more data-parallel ranks (layouts of a dp
// that train.batch_size does not divide): a sentence naming those dp sizes and the nearest batch
// sizes the largest divides; empty when it does not.
std::string BatchLimitNote(const Plan& plan);

// The estimated candidate that needs the least memory per GPU; nullptr when none was estimated.
// What to show when nothing fits.
const Candidate* ClosestToFitting(const Plan& plan);

// "fsdp tp4 pp2 dp8 mb1 1f1b recompute=full sp offload": one line naming a layout (the schedule
// only with pp > 1).
std::string DescribeLayout(const Layout& layout);

}  // namespace dtrain
