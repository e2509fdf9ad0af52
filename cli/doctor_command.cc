// `dtrain doctor [RECIPE] [--set key=value]... [--json]`: checks this node against what a run
// needs (network, RDMA, NCCL variables, memlock, /dev/shm, GPUs, checkpoint folder, master
// address) and prints each as ok / info / warn / fail with the fix. In a world of more than one
// (`srun --ntasks-per-node=1 dtrain doctor`), the processes then meet as training ranks do and
// check the nodes against each other (launch/doctor/cluster.h); rank 0 prints the summary. Exit 1
// when a check fails.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/recipe/recipe.h"
#include "launch/doctor/check.h"
#include "launch/doctor/cluster.h"
#include "launch/doctor/doctor.h"
#include "launch/environment.h"
#include "parallel/planner/catalog.h"

namespace dtrain::cli {
namespace {

void Print(const nlohmann::ordered_json& json, const std::string& text, bool as_json) {
  if (as_json) {
    std::cout << json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << text;
  }
}

}  // namespace

void AddDoctorCommand(CLI::App& app) {
  struct Args {
    std::string recipe_path;
    std::vector<std::string> overrides;
    bool json = false;
    double timeout_s = 30;
    std::string hostname;
    doctor::DoctorOptions options;
  };
  auto args = std::make_shared<Args>();
  CLI::App* command = app.add_subcommand(
      "doctor",
      "Check this node for a run: network interfaces, InfiniBand/RoCE ports and GIDs, NCCL_* "
      "variables against them and the recipe's cluster.network, memlock, /dev/shm, GPUs, the "
      "checkpoint folder, the master address; each ok / info / warn / fail with its fix. Under "
      "srun (one task per node) also the nodes against each other: the master's port from every "
      "node, clock skew, a shared checkpoint folder, all-reduce bandwidth; summary on node 0");
  command->add_option("recipe", args->recipe_path,
                      "Recipe YAML file; without one nothing is required of the node");
  AddOverrideOption(*command, args->overrides);
  command->add_flag("--json", args->json, "Print the checks as JSON");
  command->add_option("--sys-root", args->options.sys_root, "Where sysfs is (tests fake a node)")
      ->capture_default_str();
  command->add_option("--proc-root", args->options.proc_root, "Where procfs is")
      ->capture_default_str();
  command
      ->add_option("--timeout-s", args->timeout_s,
                   "Seconds a node may take to reach the master; bounds every wait")
      ->capture_default_str()
      ->check(Positive());
  command->add_option("--hostname", args->hostname,
                      "Address the other nodes reach this one's Gloo device at (default: as "
                      "training picks it: GLOO_SOCKET_IFNAME's interface, else the address this "
                      "node reaches the master from)");
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
    const absl::StatusOr<WorldEnvironment> world = ResolveWorld(options.env, {});
    if (!world.ok() || world->world_size == 1) {
      // The node checks' launch.master names a world that does not resolve.
      Print(doctor::ResultsJson(*results), doctor::ResultsText(*results), args->json);
      if (doctor::AnyFailed(*results)) throw CLI::RuntimeError(kExitFailure);
      return;
    }
    // As `dtrain train` refuses it: the nodes would wait out --timeout-s, blaming the network.
    if (absl::Status status = CheckCrossNodeToken(*world); !status.ok()) Fail(status, kExitUsage);
    std::optional<ClusterSpec> cluster;
    doctor::ClusterDoctorOptions cluster_options;
    cluster_options.env = options.env;
    cluster_options.world = *world;
    cluster_options.timeout = absl::Seconds(args->timeout_s);
    cluster_options.hostname = args->hostname;
    if (recipe.has_value()) {
      cluster = *ResolveCluster(recipe->cluster);  // RunNodeChecks resolved it
      cluster_options.cluster = &*cluster;
      cluster_options.checkpoint_dir = recipe->checkpoint_dir();
    }
    const doctor::ClusterDoctorOutcome outcome =
        doctor::RunClusterChecks(cluster_options, *std::move(results));
    bool failed = doctor::AnyFailed(outcome.cluster);
    for (const doctor::NodeReport& node : outcome.nodes) {
      failed = failed || doctor::AnyFailed(node.results);
    }
    if (outcome.summary) {
      Print(doctor::ClusterSummaryJson(outcome.nodes, outcome.cluster),
            doctor::ClusterSummaryText(outcome.nodes, outcome.cluster), args->json);
    } else if (!outcome.in_summary) {
      // Node 0 could not hear from this node: it says what it saw itself.
      Print(doctor::ClusterSummaryJson(outcome.nodes, {}),
            doctor::ClusterSummaryText(outcome.nodes, {}), args->json);
    }
    if (failed) throw CLI::RuntimeError(kExitFailure);
  });
}

}  // namespace dtrain::cli
