// The `dtrain` binary: registers the subcommands and maps the outcome to an exit code.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "core/data/datasets.h"
#include "core/model/model_size.h"
#include "core/optim/adamw.h"
#include "core/util/decimal.h"
#include "core/util/exit_codes.h"
#include "core/util/log.h"
#include "core/util/names.h"
#include "core/util/status.h"
#include "embedded_tiny_recipe.h"
#include "parallel/planner/catalog.h"
#include "parallel/trainer.h"

namespace dtrain::cli {

void AddOverrideOption(CLI::App& command, std::vector<std::string>& overrides) {
  command
      .add_option("--set", overrides,
                  "Override one recipe key, e.g. --set train.lr=3e-4 or --set data.train=[a,b]; "
                  "repeatable")
      ->type_name("KEY=VALUE")
      ->expected(1)
      // One value an occurrence: CLI11's vectors take the arguments after it too, and `train --set
      // train.steps=5 tiny.yaml` read the recipe as a second override.
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

namespace {

CLI::Validator NumberCheck(bool zero_allowed) {
  const char* bound = zero_allowed ? ">= 0" : "> 0";
  return CLI::Validator(
      [zero_allowed, bound](std::string& text) -> std::string {
        double value = 0;
        if (ParseDecimal(text, &value) && (value > 0 || (zero_allowed && value == 0))) {
          return "";
        }
        return absl::StrCat("expected a number ", bound, ", got ", text);
      },
      zero_allowed ? "NONNEGATIVE" : "POSITIVE");
}

}  // namespace

CLI::Validator NonNegative() { return NumberCheck(true); }
CLI::Validator Positive() { return NumberCheck(false); }

absl::StatusOr<Recipe> LoadTrainingRecipe(const std::string& path,
                                          const std::vector<std::string>& overrides) {
  absl::StatusOr<Recipe> recipe =
      path.empty() ? ParseRecipe(kEmbeddedTinyRecipe, "<built-in configs/tiny.yaml>", overrides)
                   : LoadRecipe(path, overrides);
  if (!recipe.ok()) return recipe.status();
  RETURN_IF_ERROR(CheckModelSize(*recipe));
  RETURN_IF_ERROR(CheckNoTildePaths(*recipe));
  RETURN_IF_ERROR(CheckMetricsAddress(*recipe));
  RETURN_IF_ERROR(
      CheckNoDecay(ModelConfigFromRecipe(recipe->model, recipe->d_ff()), recipe->train.no_decay));
  RETURN_IF_ERROR(CheckShardPatterns(*recipe));
  // The cluster section's names, which only the planner reads, are checked here too.
  RETURN_IF_ERROR(ResolveCluster(recipe->cluster).status());
  return recipe;
}

absl::Status CheckInitFromHere(const Recipe& recipe) {
  std::error_code error;
  if (!recipe.train.init_from.empty() && !std::filesystem::exists(recipe.train.init_from, error)) {
    LogWarn("train.init_from %s is not here (the nodes that train may see it)",
            recipe.train.init_from);
    return absl::OkStatus();
  }
  return CheckInitFromWeights(recipe);
}

absl::Status CheckCrossNodeToken(const WorldEnvironment& world) {
  if (world.num_nodes == 1 || !world.rdzv_token.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "this world spans ", world.num_nodes,
      " nodes, and rank 0's rendezvous store admits ranks of other hosts only with a shared "
      "secret: export DTRAIN_RDZV_TOKEN=$(openssl rand -hex 32) before srun (as "
      "scripts/slurm/train.sbatch does), or start the ranks with `dtrain launch`"));
}

void Fail(const absl::Status& status, int exit_code) {
  // One write: a process stopped while it prints (another rank failed first) leaves no half line.
  std::cerr << absl::StrCat("error: ", status.message(), "\n");
  throw CLI::RuntimeError(ExitCodeOf(status).value_or(exit_code));
}

namespace {

// `dtrain help [COMMAND]`: the same text as --help, for those who type it as a word.
void AddHelpCommand(CLI::App& app) {
  CLI::App* help = app.add_subcommand("help", "Print this help, or a command's help");
  auto topic = std::make_shared<std::string>();
  help->add_option("command", *topic, "The command to explain");
  help->callback([&app, topic] {
    if (topic->empty()) {
      // Not app.help(): once a subcommand ran, that prints the subcommand's help ("help" here).
      std::cout << app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal);
      return;
    }
    CLI::App* command = nullptr;
    try {
      command = app.get_subcommand(*topic);
    } catch (const CLI::OptionNotFound&) {
      Fail(absl::InvalidArgumentError("no command '" + *topic + "'; see 'dtrain help'"),
           kExitUsage);
    }
    std::cout << command->help(app.get_name());
  });
}

// The long option names of `command` ("--nproc-per-node").
std::vector<std::string> LongOptions(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

// A usage error of the command line in dtrain's words, with the fix: a command that does not
// exist (and the nearest that does), an option the command does not have (the nearest it has,
// or the command whose option it is: torchrun's --nproc-per-node given to train), a command
// that needs one of its own. Empty where none of these is the matter (CLI11's message then).
std::string UsageHint(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* command = &app;
  std::string path = "dtrain";
  size_t i = 0;
  for (; i < args.size(); ++i) {
    if (absl::StartsWith(args[i], "-")) continue;
    const std::vector<const CLI::App*> subcommands = command->get_subcommands({});
    if (subcommands.empty()) break;  // the command's own arguments from here
    const auto named =
        std::find_if(subcommands.begin(), subcommands.end(),
                     [&](const CLI::App* sub) { return sub->get_name() == args[i]; });
    if (named == subcommands.end()) {
      std::vector<absl::string_view> names;
      for (const CLI::App* sub : subcommands) names.push_back(sub->get_name());
      const absl::string_view nearest = NearestName(args[i], names);
      return absl::StrCat(path, " has no command '", args[i], "'",
                          nearest.empty() ? "" : absl::StrCat(" (did you mean ", nearest, "?)"),
                          "; ", path == "dtrain" ? "dtrain help" : path + " --help", " lists them");
    }
    command = *named;
    absl::StrAppend(&path, " ", args[i]);
  }
  for (const std::string& arg : args) {
    if (arg == "--") break;  // positional arguments from here
    if (!absl::StartsWith(arg, "--")) continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (command->get_option_no_throw(name) != nullptr) continue;
    std::vector<std::string> owners;
    for (const CLI::App* other : app.get_subcommands({})) {
      for (const CLI::App* sub : other->get_subcommands({})) {
        if (sub != command && sub->get_option_no_throw(name) != nullptr) {
          owners.push_back(absl::StrCat("dtrain ", other->get_name(), " ", sub->get_name()));
        }
      }
      if (other != command && other->get_option_no_throw(name) != nullptr) {
        owners.push_back(absl::StrCat("dtrain ", other->get_name()));
      }
    }
    if (!owners.empty()) {
      return absl::StrCat(path, " has no option ", name, " (", absl::StrJoin(owners, " and "),
                          owners.size() == 1 ? " has" : " have", " it); see ", path, " --help");
    }
    const std::vector<std::string> options = LongOptions(*command);
    const absl::string_view nearest =
        NearestName(name, std::vector<absl::string_view>(options.begin(), options.end()));
    return absl::StrCat(path, " has no option ", name,
                        nearest.empty() ? "" : absl::StrCat(" (did you mean ", nearest, "?)"),
                        "; see ", path, " --help");
  }
  // --set takes one KEY=VALUE an occurrence: `--set a=1 b=2` left b=2 over, which CLI11 calls
  // not expected.
  for (size_t k = 1; k < args.size(); ++k) {
    const bool after_set =
        (k >= 2 && args[k - 2] == "--set") || absl::StartsWith(args[k - 1], "--set=");
    if (after_set && !absl::StartsWith(args[k], "-") && absl::StrContains(args[k], '=')) {
      return absl::StrCat("--set takes one KEY=VALUE: write --set ", args[k]);
    }
  }
  if (const std::vector<const CLI::App*> subcommands = command->get_subcommands({});
      command != &app && !subcommands.empty() && i == args.size()) {
    std::vector<std::string> names;
    for (const CLI::App* sub : subcommands) names.push_back(sub->get_name());
    return absl::StrCat(path, " needs a command: ", absl::StrJoin(names, ", "), "; see ", path,
                        " --help");
  }
  return "";
}

// The exit code of a command that succeeded, once its output is out: output sent to a full disk
// (or /dev/full) fails at a write or at this flush, which exit 0 would hide. A closed pipe
// (EPIPE, where SIGPIPE is ignored) is no error: the reader stopped on purpose (`| head -1`), and
// SIGPIPE ends the other commands as silently.
int StandardOutputExitCode() {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout) && std::cout.good()) return 0;
  // stdio keeps no errno of the write that failed: a newline after the output, which is cut
  // already, fails the same way (a full disk, a closed pipe) and says why.
  const int error = ::write(STDOUT_FILENO, "\n", 1) < 0 ? errno : 0;
  if (error == EPIPE) return 0;
  std::cerr << absl::StrCat("error: cannot write to standard output: ",
                            error != 0 ? std::strerror(error) : "a write failed", "\n");
  return kExitFailure;
}

}  // namespace
}  // namespace dtrain::cli

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f) fails with EFBIG, which names the limit and exits
  // 3, instead of SIGXFSZ ending the process with no word at its first checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app("dtrain: trains GPT-2 and Llama style transformers, from one CPU to a cluster",
               "dtrain");
  app.set_version_flag("--version", "dtrain " DTRAIN_VERSION);
  // CLI11's own parse errors begin as dtrain's do, "error: ", for whoever greps a job's log.
  app.failure_message([](const CLI::App* failed, const CLI::Error& error) {
    return absl::StrCat("error: ", CLI::FailureMessage::simple(failed, error));
  });
  app.require_subcommand(0, 1);

  dtrain::cli::AddTrainCommand(app);
  dtrain::cli::AddRecipeCommand(app);
  dtrain::cli::AddDataCommand(app);
  dtrain::cli::AddPlanCommand(app);
  dtrain::cli::AddBenchCommand(app);
  dtrain::cli::AddCkptCommand(app);
  dtrain::cli::AddEnvCommand(app);
  dtrain::cli::AddLaunchCommand(app);
  dtrain::cli::AddReportCommand(app);
  dtrain::cli::AddDoctorCommand(app);
  dtrain::cli::AddHelpCommand(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // the command already printed its message
  } catch (const CLI::ParseError& e) {
    // CLI11 stops at the flag (CallForVersion), whatever follows it.
    if (dynamic_cast<const CLI::CallForVersion*>(&e) != nullptr && argc > 2) {
      std::cerr << "error: --version takes nothing else; run dtrain --version alone\n";
      return dtrain::kExitUsage;
    }
    if (e.get_exit_code() != 0) {
      const std::string hint =
          dtrain::cli::UsageHint(app, std::vector<std::string>(argv + 1, argv + argc));
      if (!hint.empty()) {
        std::cerr << "error: " << hint << "\n";
        return dtrain::kExitUsage;
      }
    }
    const int code = app.exit(e);  // prints help, the version, or the usage error
    return code == 0 ? 0 : dtrain::kExitUsage;
  }
  if (app.get_subcommands().empty()) {
    std::cerr << app.help();
    return dtrain::kExitUsage;
  }
  return dtrain::cli::StandardOutputExitCode();
}
