// `dtrain train [RECIPE] [--set key=value]...`: one process runs the whole training job.
#include <CLI/CLI.hpp>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "cli/commands.h"
#include "core/backend/make_backend.h"
#include "core/recipe/recipe.h"
#include "core/util/log.h"
#include "launch/environment.h"
#include "parallel/checkpointing.h"
#include "parallel/trainer.h"

namespace dtrain::cli {

void AddTrainCommand(CLI::App& app) {
  struct Args {
    std::string recipe_path;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* command = app.add_subcommand(
      "train", "Train in this process (one rank per process under srun or launch)");
  command->add_option("recipe", args->recipe_path,
                      "Recipe YAML file; none = the built-in tiny recipe (configs/tiny.yaml)");
  AddOverrideOption(*command, args->overrides);
  command->callback([args] {
    // A reader of the output that went away (`| head`, a closed log shipper) costs the output,
    // not the run and its checkpoint: writes fail with EPIPE instead (as under `dtrain launch`,
    // and as every rank of a multi-process run does for its sockets).
    std::signal(SIGPIPE, SIG_IGN);
    absl::StatusOr<WorldEnvironment> world = RankWorldFromEnvironment();
    // Every rank reads the same recipe: its warnings are rank 0's to print, not once a rank, and
    // under `dtrain launch` the agent's, which printed them once before any worker started.
    absl::StatusOr<Recipe> recipe = [&] {
      const QuietLogScope quiet(world.ok() && (world->rank != 0 || world->agent_hosts_store));
      return LoadTrainingRecipe(args->recipe_path, args->overrides);
    }();
    if (!recipe.ok()) Fail(recipe.status(), kExitUsage);
    if (!world.ok()) Fail(world.status(), kExitFailure);
    if (absl::Status status = CheckCrossNodeToken(*world); !status.ok()) Fail(status, kExitUsage);
    if (absl::Status status = CheckRecipeFitsWorld(*recipe, world->world_size); !status.ok()) {
      Fail(status, kExitUsage);
    }
    // A restart resumes from the run's own checkpoints, whatever checkpoint.resume names.
    if (absl::Status status = CheckResumePathExists(recipe->checkpoint.resume);
        world->restart_count == 0 && !status.ok()) {
      Fail(status, kExitUsage);
    }
    // Before anything is written: no GPU for run.device: cuda is a usage error.
    if (absl::Status status = CheckDevice(recipe->run.device, world->local_rank); !status.ok()) {
      Fail(status, kExitUsage);
    }
    // Under torchrun's agent store the port is not the one the user gave: say so before a
    // busy port's error names it.
    if (const auto port = world->provenance.find("master_port");
        world->rank == 0 && world->world_size > 1 && port != world->provenance.end() &&
        absl::StartsWith(port->second, "derived from MASTER_PORT")) {
      LogInfo("rendezvous store on port %d, %s", world->master_port, port->second);
    }
    const absl::StatusOr<TrainingEnd> end = RunTraining(*recipe, *world);
    // A failure a restart would repeat (a full disk) asks for its own exit code.
    if (!end.ok()) Fail(end.status(), kExitFailure);
    if (*end == TrainingEnd::kStopped) throw CLI::RuntimeError(kExitStopped);
  });
}

}  // namespace dtrain::cli
