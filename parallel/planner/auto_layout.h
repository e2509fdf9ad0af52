// `parallel.strategy: auto`: the plan for the world a run actually has, limited to the layouts
// the trainer can run, written back into the recipe.
//
// The trainer calls ResolveAutoLayout once at start-up with its world size and the layouts it
// implements. A better layout that it cannot run yet is reported in `note`, never silently
// replaced; no runnable layout that fits is an error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/recipe/recipe.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/search.h"

namespace dtrain {

struct AutoLayout {
  Layout layout;
  Estimate estimate;
  // Empty, or one line naming the faster layout the unrestricted plan recommends and what
  // choosing the runnable one costs, for the trainer to log.
  std::string note;
};

// The layouts the trainer runs today: every data-parallel engine, tensor parallelism among the
// `ranks_per_node` ranks of one machine (kv heads split or replicated, with sequence
// parallelism), pipelines under every schedule (1F1B, GPipe, interleaved), no or full
// recomputation; no offload yet. Every machine must run the same number of ranks, so that every
// rank picks the same layout.
SearchOptions TrainerLayouts(int ranks_per_node);

// `runnable` with the recipe's pipeline schedule (the user's choice: parallel.pp_schedule where
// `runnable` has it, else every one `runnable` has), its parallel.pp_virtual_stages and the
// engine's unit sizes (parallel.bucket_mb, prefetch_bucket_mb).
SearchOptions WithRecipeSettings(const Recipe& recipe, SearchOptions runnable);

// Plans recipe's model and batch for `world_size` ranks, with recipe.cluster's hardware: nodes
// are world_size / cluster.gpus_per_node (one node of world_size GPUs when fewer).
// `runnable` restricts the search to what the trainer implements, its schedule to
// WithRecipeSettings's. `bytes_per_rank`, when positive, is each rank's memory in place of
// cluster.gpu's (CPU ranks: their share of the machine's), planned as PlanForMemory plans it.
absl::StatusOr<AutoLayout> ResolveAutoLayout(const Recipe& recipe, int world_size,
                                             const SearchOptions& runnable,
                                             double bytes_per_rank = 0);

// For a rank that does not fit its memory: the plan of recipe's model and batch in what the
// trainer holds (Precision::Trainer at the recipe's run.precision) over the layouts it runs
// (`runnable`) on `nodes` machines of `ranks_per_node` ranks that have `bytes_per_rank` each. That
// memory is what is free once the backend runs, so the planner's allowance for the runtime
// (CostAssumptions::runtime_gib) is left out. Its recommendation, if any, is the layout that
// fits.
absl::StatusOr<Plan> PlanForMemory(const Recipe& recipe, int nodes, int ranks_per_node,
                                   double bytes_per_rank, SearchOptions runnable);

// Sets parallel.strategy/tp/pp/pp_schedule/pp_virtual_stages/sequence_parallel/recompute and
// train.micro_batch from `layout` (the schedule only with pp > 1).
// InvalidArgument for a layout the recipe cannot express (optimizer offload).
absl::Status ApplyLayout(const Layout& layout, Recipe& recipe);

// The layout that the recipe's parallel keys and train.micro_batch give on `world_size` ranks
// (ApplyLayout's inverse); nullopt for parallel.strategy auto, dp 0 where tp x pp does not divide
// the world.
std::optional<Layout> RecipeLayout(const Recipe& recipe, int world_size);

}  // namespace dtrain
