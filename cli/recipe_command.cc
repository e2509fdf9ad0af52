// `dtrain recipe check RECIPE [--set key=value]...` and `dtrain recipe reference`.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/data/datasets.h"
#include "core/recipe/recipe.h"
#include "core/util/log.h"

namespace dtrain::cli {

void AddRecipeCommand(CLI::App& app) {
  CLI::App* recipe = app.add_subcommand("recipe", "Validate recipes and document their keys");
  recipe->require_subcommand(1);

  struct CheckArgs {
    std::string recipe_path;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<CheckArgs>();
  CLI::App* check = recipe->add_subcommand(
      "check", "Validate a recipe and print it resolved: every key, defaults filled in");
  check->add_option("recipe", args->recipe_path, "Recipe YAML file")->required();
  AddOverrideOption(*check, args->overrides);
  check->callback([args] {
    absl::StatusOr<Recipe> loaded = LoadTrainingRecipe(args->recipe_path, args->overrides);
    if (!loaded.ok()) Fail(loaded.status(), kExitUsage);
    if (const absl::Status init = CheckInitFromHere(*loaded); !init.ok()) Fail(init, kExitUsage);
    // A warning: the nodes that train may see files this machine does not.
    if (const absl::Status data = CheckDataFilesExist(*loaded); !data.ok()) {
      LogWarn("%s (here; the nodes that train may see other files)", data.message());
    }
    std::cout << ResolvedRecipeYaml(*loaded);
  });

  recipe->add_subcommand("reference", "Print every recipe key as a Markdown table")->callback([] {
    std::cout << RecipeReferenceMarkdown();
  });
}

}  // namespace dtrain::cli
