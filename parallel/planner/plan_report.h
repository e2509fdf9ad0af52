// How a plan reads: a table with units, or JSON, plus what to run it with: the network
// environment, the recipe's `parallel:` lines and the sbatch lines.
//
// Formatting only; every number comes from the plan. `top_n` bounds the alternatives shown: the
// best layout of each strategy first (or, where none fits, the one closest to fitting), then
// the next fastest.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/planner/catalog.h"
#include "parallel/planner/search.h"

namespace dtrain {

// The candidates to show after the recommendation, at most `top_n`.
std::vector<const Candidate*> Alternatives(const Plan& plan, int top_n);

// `export NAME=value  # why` lines for NCCL on this cluster's network, and the collective
// timeout to use for a step of `step_ms`.
std::vector<std::pair<std::string, std::string>> NetworkEnvironment(const ClusterSpec& cluster);
double CollectiveTimeoutS(double step_ms);

// The recipe keys that select `layout` and their values, in the recipe's order
// ("parallel.strategy", "fsdp"), ..., ("train.micro_batch", "2"); optimizer offload has no key yet.
std::vector<std::pair<std::string, std::string>> LayoutSettings(const Layout& layout);

// The recipe keys and values that run `layout` on the cluster's GPUs: run.device cuda, then
// LayoutSettings with parallel.timeout_s `timeout_s` among the parallel keys.
std::vector<std::pair<std::string, std::string>> PlanSettings(const Layout& layout,
                                                              double timeout_s);

// PlanSettings as recipe lines, by section.
std::string RecipeLines(const Layout& layout, double timeout_s);

// The pipeline stages of `layout` (pp > 1, one virtual stage): blocks balanced on the cost
// model's FLOPs per token (parallel/pipeline/stage_assignment.h) and the heaviest stage's load.
std::string PipelineStagesLine(const Workload& workload, const Layout& layout);

// A batch script that starts one rank per GPU for `recipe_path` with PlanSettings as --set
// arguments: #SBATCH lines (a SIGTERM before the time limit, requeued when preempted), the
// rendezvous token several nodes need, the network environment, and srun, which ends the step
// when a rank fails.
std::string SbatchLines(const ClusterSpec& cluster, const std::string& recipe_path,
                        const Layout& layout, double timeout_s);

// The whole plan as text for a terminal.
std::string PlanText(const Plan& plan, const std::string& recipe_path, int top_n);

// The whole plan as JSON (same content as PlanText; numbers in the units their keys name).
nlohmann::json PlanJson(const Plan& plan, const std::string& recipe_path, int top_n);

// The planner's catalog (CatalogText's content) as JSON, for `dtrain plan --catalog --json`:
// {"gpus": [...], "links": [...]}, each figure under a key that names its unit.
nlohmann::json CatalogJson();

}  // namespace dtrain
