// `dtrain doctor [RECIPE] [--set key=value]... [--json]`: checks this node against what a run
// needs (network, RDMA, NCCL variables, memlock, /dev/shm, GPUs, checkpoint folder, master
// address) and prints each as ok / info / warn / fail with the fix. Exit 1 when a check fails.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/recipe/recipe.h"
#include "launch/doctor/check.h"
#include "launch/doctor/doctor.h"
#include "launch/environment.h"

namespace dtrain::cli {

void AddDoctorCommand(CLI::App& app) {
  struct Args {
    std::string recipe_path;
    std::vector<std::string> overrides;
    bool json = false;
    doctor::DoctorOptions options;
  };
  auto args = std::make_shared<Args>();
  CLI::App* command = app.add_subcommand(
      "doctor",
      "Check this node for a run: network interfaces, InfiniBand/RoCE ports and GIDs, NCCL_* "
      "variables against them and the recipe's cluster.network, memlock, /dev/shm, GPUs, the "
      "checkpoint folder, the master address; each ok / info / warn / fail with its fix");
  command->add_option("recipe", args->recipe_path,
                      "Recipe YAML file; without one nothing is required of the node");
  AddOverrideOption(*command, args->overrides);
  command->add_flag("--json", args->json, "Print the checks as JSON");
  command->add_option("--sys-root", args->options.sys_root, "Where sysfs is (tests fake a node)")
      ->capture_default_str();
  command->add_option("--proc-root", args->options.proc_root, "Where procfs is")
      ->capture_default_str();
  command->callback([args] {
    std::optional<Recipe> recipe;
    if (!args->recipe_path.empty()) {
      absl::StatusOr<Recipe> loaded = LoadRecipe(args->recipe_path, args->overrides);
      if (!loaded.ok()) Fail(loaded.status(), kExitUsage);
      recipe = *std::move(loaded);
    }
    doctor::DoctorOptions options = args->options;
    options.env = ProcessEnvironment();
    options.recipe = recipe.has_value() ? &*recipe : nullptr;
    absl::StatusOr<std::vector<doctor::CheckResult>> results = doctor::RunNodeChecks(options);
    if (!results.ok()) Fail(results.status(), kExitUsage);
    if (args->json) {
      std::cout << doctor::ResultsJson(*results).dump(2, ' ', false,
                                                      nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      std::cout << doctor::ResultsText(*results);
    }
    if (doctor::AnyFailed(*results)) throw CLI::RuntimeError(kExitFailure);
  });
}

}  // namespace dtrain::cli
