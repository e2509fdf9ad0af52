// The subcommands of `dtrain`, one file each. Each Add*Command registers its subcommand, options
// and callback on the top-level app; main.cc only calls them. A callback that fails prints one
// message to stderr and throws CLI::RuntimeError(exit_code), which main turns into the exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/recipe/recipe.h"
#include "core/util/exit_codes.h"
#include "launch/environment.h"

namespace dtrain::cli {

void AddTrainCommand(CLI::App& app);
void AddRecipeCommand(CLI::App& app);
void AddDataCommand(CLI::App& app);
void AddPlanCommand(CLI::App& app);
void AddBenchCommand(CLI::App& app);
void AddCkptCommand(CLI::App& app);
void AddEnvCommand(CLI::App& app);
void AddLaunchCommand(CLI::App& app);
void AddReportCommand(CLI::App& app);
void AddDoctorCommand(CLI::App& app);

// The `--set section.key=value` option shared by every command that reads a recipe.
void AddOverrideOption(CLI::App& command, std::vector<std::string>& overrides);

// Option checks for numbers >= 0 and > 0 whose error reads "expected a number >= 0, got -1"
// (CLI11's NonNegativeNumber and PositiveNumber print their bound as a 309-digit double).
CLI::Validator NonNegative();
CLI::Validator Positive();

// The recipe a training command runs: RECIPE (the built-in tiny recipe when empty) with the
// overrides, validated, its model within dtrain's size bound (core/model/model_size.h) and its
// train.no_decay globs each matching a tensor (CheckNoDecay).
absl::StatusOr<Recipe> LoadTrainingRecipe(const std::string& path,
                                          const std::vector<std::string>& overrides);

// InvalidArgument for a world of ranks started without the agent (srun, torchrun) that spans
// several nodes with no DTRAIN_RDZV_TOKEN: rank 0's rendezvous store admits the ranks of other
// hosts only with the job's shared secret, and they would wait out their timeout.
absl::Status CheckCrossNodeToken(const WorldEnvironment& world);

// train.init_from's weights where they are on this machine, as `dtrain train` checks them at its
// start: another model, a feature dtrain lacks or a folder without weights is an error. Weights
// that are not here may be on the nodes that train: a warning.
absl::Status CheckInitFromHere(const Recipe& recipe);

// Prints "error: <message>" to stderr and ends the command with the exit code the status asks
// for (ExitCodeOf: a file error that a restart would meet again), else `exit_code`.
[[noreturn]] void Fail(const absl::Status& status, int exit_code);

}  // namespace dtrain::cli
