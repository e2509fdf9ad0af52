// `dtrain plan RECIPE [--set key=value]... [--json] [--top N]` and `dtrain plan --catalog
// [--json]`.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "core/model/model_size.h"
#include "core/recipe/recipe.h"
#include "parallel/planner/auto_layout.h"
#include "parallel/planner/catalog.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/plan_report.h"
#include "parallel/planner/search.h"

namespace dtrain::cli {

void AddPlanCommand(CLI::App& app) {
  struct Args {
    std::string recipe_path;
    std::vector<std::string> overrides;
    bool json = false;
    int top = 8;
    bool catalog = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* command = app.add_subcommand(
      "plan",
      "Recommend a parallel layout for the recipe's model on its cluster section: memory, "
      "communication and step time per layout, rejected layouts with reasons, NCCL settings");
  command->add_option("recipe", args->recipe_path,
                      "Recipe YAML file (needed, except with --catalog)");
  AddOverrideOption(*command, args->overrides);
  command->add_flag("--json", args->json, "Print the plan as JSON");
  command
      ->add_option("--top", args->top,
                   "Alternatives to show below the recommended layout (its row comes first)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  command->add_flag("--catalog", args->catalog,
                    "List the GPUs and networks cluster.gpu and cluster.network can name (as "
                    "JSON with --json)");
  command->callback([args] {
    if (args->catalog) {
      if (!args->recipe_path.empty()) {
        Fail(absl::InvalidArgumentError(absl::StrCat(
                 "dtrain plan --catalog lists the catalog and takes no recipe (got '",
                 args->recipe_path, "'): run dtrain plan ", args->recipe_path, " for its plan")),
             kExitUsage);
      }
      if (args->json) {
        std::cout << CatalogJson().dump(2) << "\n";
      } else {
        std::cout << CatalogText();
      }
      return;
    }
    if (args->recipe_path.empty()) {
      Fail(absl::InvalidArgumentError("dtrain plan needs a recipe file, e.g. dtrain plan "
                                      "configs/llama-7b.yaml --set cluster.nodes=8"),
           kExitUsage);
    }
    absl::StatusOr<Recipe> recipe = LoadRecipe(args->recipe_path, args->overrides);
    if (!recipe.ok()) Fail(recipe.status(), kExitUsage);
    if (const absl::Status init = CheckInitFromHere(*recipe); !init.ok()) Fail(init, kExitUsage);
    if (absl::Status bounded = CheckParameterCount(*recipe); !bounded.ok()) {
      Fail(bounded, kExitUsage);
    }
    absl::StatusOr<ClusterSpec> cluster = ResolveCluster(recipe->cluster);
    if (!cluster.ok()) Fail(cluster.status(), kExitUsage);
    // Pipelines in the recipe's schedule where the trainer runs it (else the ones it runs), so
    // that the printed recipe lines are a recipe that dtrain train accepts.
    SearchOptions options;
    options.pp_schedules = TrainerLayouts(cluster->gpus_per_node).pp_schedules;
    options = WithRecipeSettings(*recipe, options);
    absl::StatusOr<Plan> plan = SearchLayouts(GpuWorkloadFromRecipe(*recipe), *cluster, options);
    if (!plan.ok()) Fail(plan.status(), kExitUsage);
    plan->recipe_layout = RecipeLayout(*recipe, cluster->world_size());
    if (args->json) {
      std::cout << PlanJson(*plan, args->recipe_path, args->top)
                       .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      std::cout << PlanText(*plan, args->recipe_path, args->top);
    }
    if (plan->recommendation() == nullptr) Fail(WhyNoLayout(*plan), kExitFailure);
  });
}

}  // namespace dtrain::cli
