#include "parallel/planner/auto_layout.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/util/exit_codes.h"
#include "core/util/status.h"
#include "parallel/planner/catalog.h"

namespace dtrain {
namespace {

absl::StatusOr<ClusterSpec> ClusterForWorld(const ClusterSection& section, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " must be >= 1"));
  }
  ClusterSection resized = section;
  if (world_size <= section.gpus_per_node) {
    resized.nodes = 1;
    resized.gpus_per_node = world_size;
  } else if (world_size % section.gpus_per_node == 0) {
    resized.nodes = world_size / section.gpus_per_node;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.strategy auto: the world of ", world_size,
        " ranks is not a whole number of nodes of cluster.gpus_per_node = ", section.gpus_per_node,
        "; set cluster.gpus_per_node to the ranks per node, or choose "
        "parallel.strategy yourself"));
  }
  return ResolveCluster(resized);
}

// Plans in `bytes_per_rank` of memory as the trainer holds it there: memory that is free once
// the backend runs (no allowance for a GPU runtime).
void PlanInRankMemory(double bytes_per_rank, ClusterSpec& cluster, SearchOptions& options) {
  cluster.gpu_memory_gib = bytes_per_rank / kGiB;
  options.assumptions.runtime_gib = 0;
}

}  // namespace

SearchOptions TrainerLayouts(int ranks_per_node) {
  SearchOptions runnable;
  runnable.strategies = {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3,
                         Strategy::kFsdp};
  // The recipe's cluster.gpus_per_node may describe other machines than these: a tp group
  // spanning two would all-reduce every block's activations over the network.
  runnable.max_tp = std::max(ranks_per_node, 1);
  runnable.max_pp = 0;  // every stage count that divides the blocks
  // Searched alone, 1F1B wins (SearchOptions::pp_schedules); ResolveAutoLayout keeps the
  // recipe's parallel.pp_schedule.
  runnable.pp_schedules = {PipelineSchedule::kOneFOneB, PipelineSchedule::kGpipe,
                           PipelineSchedule::kInterleaved};
  runnable.allow_offload = false;
  return runnable;
}

SearchOptions WithRecipeSettings(const Recipe& recipe, SearchOptions runnable) {
  const absl::StatusOr<PipelineSchedule> asked = ParsePipelineSchedule(recipe.parallel.pp_schedule);
  if (asked.ok() && absl::c_linear_search(runnable.pp_schedules, *asked)) {
    runnable.pp_schedules = {*asked};
  }
  runnable.pp_virtual_stages = recipe.parallel.pp_virtual_stages;
  runnable.assumptions.bucket_mib = recipe.parallel.bucket_mb;
  runnable.assumptions.prefetch_bucket_mib = recipe.parallel.prefetch_bucket_mb;
  return runnable;
}

absl::StatusOr<AutoLayout> ResolveAutoLayout(const Recipe& recipe, int world_size,
                                             const SearchOptions& runnable, double bytes_per_rank) {
  ASSIGN_OR_RETURN(ClusterSpec cluster, ClusterForWorld(recipe.cluster, world_size));
  const Workload workload = WorkloadFromRecipe(recipe, Precision::Trainer(recipe.bf16_params()));
  SearchOptions options = WithRecipeSettings(recipe, runnable);
  if (bytes_per_rank > 0) PlanInRankMemory(bytes_per_rank, cluster, options);
  ASSIGN_OR_RETURN(const Plan restricted, SearchLayouts(workload, cluster, options));
  const Candidate* chosen = restricted.recommendation();
  if (chosen == nullptr) {
    const Candidate* closest = ClosestToFitting(restricted);
    const std::string why =
        closest == nullptr
            ? absl::StrCat(
                  "none divides train.batch_size (", recipe.train.batch_size,
                  ") among its data-parallel ranks and model.n_head and model.n_layer among its "
                  "tensor and pipeline degrees; a train.batch_size that is a multiple of ",
                  world_size, " splits over every rank, or use another world size")
            : absl::StrCat("the closest: ", DescribeLayout(closest->layout), ": ", closest->reason);
    // The recipe against the world: a restart would fail alike (exit 2).
    return WithExitCode(
        absl::FailedPreconditionError(
            absl::StrCat("parallel.strategy auto: no layout the trainer runs fits ", world_size,
                         " ranks; ", why, ". Run 'dtrain plan' on the recipe to see every option")),
        kExitUsage);
  }
  AutoLayout result{.layout = chosen->layout, .estimate = chosen->estimate};
  SearchOptions unrestricted;
  unrestricted.assumptions = options.assumptions;
  unrestricted.memory_margin = runnable.memory_margin;
  unrestricted.simpler_within = runnable.simpler_within;
  unrestricted.simpler_within_ms = runnable.simpler_within_ms;
  unrestricted.pp_schedules = options.pp_schedules;
  unrestricted.pp_virtual_stages = options.pp_virtual_stages;
  ASSIGN_OR_RETURN(const Plan full, SearchLayouts(workload, cluster, unrestricted));
  // The unrestricted plan may prefer a layout the trainer runs too (its simplest-within-a-margin
  // rule sees other candidates): only a layout outside the trainer's is worth a note.
  const Candidate* best = full.recommendation();
  const bool runnable_too =
      best != nullptr && absl::c_any_of(restricted.candidates, [&](const Candidate& candidate) {
        return candidate.layout == best->layout &&
               (candidate.verdict == Verdict::kRecommended || candidate.verdict == Verdict::kFits);
      });
  if (best != nullptr && !runnable_too) {
    const double chosen_ms = chosen->estimate.time.step_ms;
    const double best_ms = best->estimate.time.step_ms;
    result.note = absl::StrFormat(
        "the plan recommends %s (%s ms per step), which the trainer cannot run yet; using %s "
        "(%s ms, %+.1f%%)",
        DescribeLayout(best->layout), FormatMs(best_ms), DescribeLayout(chosen->layout),
        FormatMs(chosen_ms), 100 * (chosen_ms - best_ms) / best_ms);
  }
  return result;
}

absl::StatusOr<Plan> PlanForMemory(const Recipe& recipe, int nodes, int ranks_per_node,
                                   double bytes_per_rank, SearchOptions runnable) {
  ClusterSection section = recipe.cluster;
  section.nodes = nodes;
  section.gpus_per_node = ranks_per_node;
  ASSIGN_OR_RETURN(ClusterSpec cluster, ResolveCluster(section));
  SearchOptions options = WithRecipeSettings(recipe, std::move(runnable));
  PlanInRankMemory(bytes_per_rank, cluster, options);
  const Workload workload = WorkloadFromRecipe(recipe, Precision::Trainer(recipe.bf16_params()));
  return SearchLayouts(workload, cluster, options);
}

absl::Status ApplyLayout(const Layout& layout, Recipe& recipe) {
  if (layout.offload) {
    return absl::InvalidArgumentError(absl::StrCat("the layout ", DescribeLayout(layout),
                                                   " needs optimizer offload, which the recipe "
                                                   "cannot express yet"));
  }
  recipe.parallel.strategy = std::string(StrategyName(layout.strategy));
  recipe.parallel.tp = layout.tp;
  recipe.parallel.pp = layout.pp;
  if (layout.pp > 1)
    recipe.parallel.pp_schedule = std::string(PipelineScheduleName(layout.schedule));
  recipe.parallel.pp_virtual_stages = layout.virtual_stages;
  recipe.parallel.sequence_parallel = layout.sequence_parallel;
  recipe.parallel.recompute = std::string(RecomputeName(layout.recompute));
  recipe.train.micro_batch = layout.micro_batch;
  return absl::OkStatus();
}

std::optional<Layout> RecipeLayout(const Recipe& recipe, int world_size) {
  const ParallelSection& parallel = recipe.parallel;
  const int tp_pp = parallel.tp * parallel.pp;
  if (parallel.strategy == "auto" || tp_pp <= 0) return std::nullopt;
  Layout layout{.tp = parallel.tp,
                .pp = parallel.pp,
                .dp = world_size % tp_pp == 0 ? world_size / tp_pp : 0,
                .micro_batch = recipe.train.micro_batch,
                .sequence_parallel = parallel.sequence_parallel && parallel.tp > 1};
  for (const Strategy strategy :
       {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3, Strategy::kFsdp}) {
    if (StrategyName(strategy) == parallel.strategy) layout.strategy = strategy;
  }
  if (parallel.pp > 1) {
    layout.schedule = ParsePipelineSchedule(parallel.pp_schedule).value_or(layout.schedule);
    if (layout.schedule == PipelineSchedule::kInterleaved) {
      layout.virtual_stages = parallel.pp_virtual_stages;
    }
  }
  layout.recompute = ParseRecompute(parallel.recompute).value_or(Recompute::kNone);
  return layout;
}

}  // namespace dtrain
