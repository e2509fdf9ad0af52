// `dtrain launch [RECIPE] [--nproc-per-node N] [--max-restarts K] ...`: the per-node agent that
// starts, watches and restarts the workers (launch/launcher.h says how it finds its place).
#include <CLI/CLI.hpp>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/data/datasets.h"
#include "core/recipe/recipe.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "launch/gpus.h"
#include "launch/launcher.h"
#include "parallel/trainer.h"

namespace dtrain::cli {

void AddLaunchCommand(CLI::App& app) {
  struct Args {
    LaunchOptions launch;
    std::string nproc_per_node;
    int node_rank = -1;
    int num_nodes = 0;
    std::string master_addr;
    int master_port = 0;
    std::string run_id;
    int rendezvous_timeout_s = 300;
    int stop_grace_s = 20;
  };
  auto args = std::make_shared<Args>();
  CLI::App* command = app.add_subcommand(
      "launch",
      "Start this node's agent: one worker per GPU (or --nproc-per-node), restarted on failure; "
      "from a Slurm batch script, one agent per node through srun");
  command->add_option("recipe", args->launch.recipe_path,
                      "Recipe YAML file; none = the built-in tiny recipe (configs/tiny.yaml)");
  AddOverrideOption(*command, args->launch.overrides);
  command->add_option("--nproc-per-node", args->nproc_per_node,
                      "Workers on this node: a number; gpu, one per visible NVIDIA GPU; auto, that "
                      "or 1 without a GPU; cpu, 1 (default: the pod's PET_NPROC_PER_NODE, else 1)");
  command
      ->add_option("--max-restarts", args->launch.max_restarts,
                   "Restarts of the whole group after a worker fails (default 0)")
      ->check(NonNegative());
  command->add_option("--node-rank", args->node_rank, "This node's index (default: environment)")
      ->check(NonNegative());
  command->add_option("--nnodes", args->num_nodes, "Number of nodes (default: environment)")
      ->check(Positive());
  command->add_option("--master-addr", args->master_addr,
                      "Host of node 0, which hosts the rendezvous store (default: environment)");
  command
      ->add_option("--master-port", args->master_port,
                   "Port of the rendezvous store (default: environment, derived under Slurm, "
                   "a free one when standalone)")
      ->check(CLI::Range(1, 65535));
  command->add_option("--run-id", args->run_id, "Name of the run (default: environment)");
  command->add_option("--log-dir", args->launch.log_dir,
                      "Write each worker's output to DIR/rank-R.log instead of the console");
  command
      ->add_option("--rdzv-timeout-s", args->rendezvous_timeout_s,
                   "Seconds to wait for the other nodes' agents (default 300)")
      ->check(Positive());
  command
      ->add_option("--stop-grace-s", args->stop_grace_s,
                   "Seconds workers get to checkpoint after SIGTERM before SIGKILL (default 20; "
                   "at least 1, since 0 would kill them before they save; keep it below Slurm's "
                   "KillWait)")
      ->check(Positive());
  command->add_flag("--requeue", args->launch.requeue,
                    "Under Slurm: after SIGTERM (time limit, preemption) and a clean checkpoint, "
                    "requeue the job so that it resumes (submit with sbatch --requeue)");
  command->callback([args] {
    // A reader of the agent's output that went away (a log shipper, `| head`) costs the output,
    // not the job, nor the exit code: writes fail with EPIPE instead. Workers get SIGPIPE back
    // (Subprocess).
    std::signal(SIGPIPE, SIG_IGN);
    // Check the recipe here, once, before any process starts.
    absl::StatusOr<Recipe> recipe =
        LoadTrainingRecipe(args->launch.recipe_path, args->launch.overrides);
    if (!recipe.ok()) Fail(recipe.status(), kExitUsage);
    LaunchOptions& launch = args->launch;
    launch.recipe_threads = recipe->run.threads;
    launch.checkpoint_dir = recipe->checkpoint_dir();
    launch.checkpoint_resume = recipe->checkpoint.resume;
    launch.check_world = [layout = *recipe, max_restarts = launch.max_restarts](int world_size,
                                                                                int num_nodes) {
      RETURN_IF_ERROR(CheckRecipeFitsWorld(layout, world_size));
      // Of one node alone: another node's agent would wait out its rendezvous for this one.
      if (num_nodes == 1) RETURN_IF_ERROR(CheckDataFilesExist(layout));
      if (max_restarts > 0 && layout.checkpoint.interval == 0) {
        LogWarn(
            "--max-restarts %d restarts failed workers from the newest checkpoint, and "
            "checkpoint.interval is 0: none is saved on the way (only at the end, on SIGTERM and "
            "on SIGUSR1), so a restart trains from step 1 again; set checkpoint.interval",
            max_restarts);
      }
      return absl::OkStatus();
    };
    if (args->nproc_per_node == "gpu" || args->nproc_per_node == "auto" ||
        args->nproc_per_node == "cpu") {
      launch.nproc_kind = args->nproc_per_node;  // counted on each node
    } else if (!args->nproc_per_node.empty()) {
      const absl::StatusOr<int> count = ParseProcessesPerNode(args->nproc_per_node, {});
      if (!count.ok()) Fail(count.status(), kExitUsage);
      launch.world.nproc_per_node = *count;
    }
    if (args->node_rank >= 0) launch.world.node_rank = args->node_rank;
    if (args->num_nodes > 0) launch.world.num_nodes = args->num_nodes;
    if (!args->master_addr.empty()) launch.world.master_addr = args->master_addr;
    if (args->master_port > 0) launch.world.master_port = args->master_port;
    if (!args->run_id.empty()) launch.world.run_id = args->run_id;
    launch.rendezvous_timeout = absl::Seconds(args->rendezvous_timeout_s);
    launch.stop_grace = absl::Seconds(args->stop_grace_s);
    const absl::StatusOr<int> exit_code = Launch(launch);
    if (!exit_code.ok()) {
      Fail(exit_code.status(),
           absl::IsInvalidArgument(exit_code.status()) ? kExitUsage : kExitFailure);
    }
    if (*exit_code != 0) throw CLI::RuntimeError(*exit_code);
  });
}

}  // namespace dtrain::cli
