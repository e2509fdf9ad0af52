// `dtrain env [--json] [--nproc-per-node N] [--node-rank R] ...`: where this process sits in the
// job (rank, world, master, ...) and which variable or flag each value came from.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "core/util/utf8.h"
#include "launch/environment.h"
#include "nlohmann/json.hpp"

namespace dtrain::cli {
namespace {

// Field name and value as JSON, in the order `dtrain env` prints them. The token stays secret.
std::vector<std::pair<std::string, nlohmann::ordered_json>> FieldValues(
    const WorldEnvironment& world) {
  return {
      {"rank", world.rank},
      {"world_size", world.world_size},
      {"local_rank", world.local_rank},
      {"local_world_size", world.local_world_size},
      {"node_rank", world.node_rank},
      {"num_nodes", world.num_nodes},
      {"master_addr", world.master_addr},
      {"master_port", world.master_port},
      {"run_id", world.run_id},
      {"restart_count", world.restart_count},
      {"max_restarts", world.max_restarts},
      {"rdzv_token", world.rdzv_token.empty() ? "(none)" : "(set)"},
      {"agent_hosts_store", world.agent_hosts_store},
      {"in_slurm_allocation", world.in_slurm_allocation},
      {"slurm_batch_shell", world.slurm_batch_shell},
      {"visible_gpus", world.visible_gpus},
  };
}

std::string Provenance(const WorldEnvironment& world, const std::string& field) {
  const auto it = world.provenance.find(field);
  return it == world.provenance.end() ? "" : it->second;
}

std::string WorldText(const WorldEnvironment& world) {
  std::string text = absl::StrCat("source: ", WorldSourceName(world.source), "\n");
  for (const auto& [field, value] : FieldValues(world)) {
    std::string shown = value.is_string() ? value.get<std::string>() : value.dump();
    if (shown.empty()) shown = "(none)";
    absl::StrAppendFormat(&text, "%-20s %-24s %s\n", field, shown, Provenance(world, field));
  }
  if (const std::string unused = UnusedMasterNote(world); !unused.empty()) {
    absl::StrAppend(&text, "note: ", unused, "\n");
  }
  if (world.slurm_batch_shell) {
    absl::StrAppend(&text,
                    "note: this is a Slurm batch shell, not a rank: start ranks with srun "
                    "(srun dtrain train ...) or let dtrain launch do it\n");
  }
  return text;
}

// JSON carries only UTF-8: a variable holding another byte is named rather than printed.
absl::Status CheckFieldsAreUtf8(const WorldEnvironment& world) {
  for (const auto& [field, value] : FieldValues(world)) {
    const std::string text = value.is_string() ? value.get<std::string>() : "";
    const std::string provenance = Provenance(world, field);
    if (FirstInvalidUtf8Byte(text) == absl::string_view::npos &&
        FirstInvalidUtf8Byte(provenance) == absl::string_view::npos) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        field, " '", EscapeInvalidUtf8(text), "' (from ", EscapeInvalidUtf8(provenance),
        ") is not UTF-8 text; set the variable to UTF-8 text (a host name is ASCII)"));
  }
  return absl::OkStatus();
}

nlohmann::ordered_json WorldJson(const WorldEnvironment& world) {
  nlohmann::ordered_json json;
  json["source"] = std::string(WorldSourceName(world.source));
  nlohmann::ordered_json provenance = nlohmann::ordered_json::object();
  for (const auto& [field, value] : FieldValues(world)) {
    json[field] = value;
    provenance[field] = Provenance(world, field);
  }
  json["provenance"] = provenance;
  return json;
}

}  // namespace

void AddEnvCommand(CLI::App& app) {
  struct Args {
    bool json = false;
    bool uses_gpus = false;
    bool check_master = false;
    int rank = 0, world_size = 0, local_rank = 0, nproc_per_node = 0, node_rank = 0, num_nodes = 0,
        master_port = 0, max_restarts = 0;
    std::string master_addr, run_id;
  };
  auto args = std::make_shared<Args>();
  CLI::App* command = app.add_subcommand(
      "env",
      "Show where this process sits in the job (rank, world, master, run id) as resolved from "
      "flags, DTRAIN_*, torchrun, Slurm, Kubernetes or MPI variables, and where each value came "
      "from");
  command->add_flag("--json", args->json, "Print the resolved world as JSON");
  CLI::Option* rank = command->add_option("--rank", args->rank, "Global rank");
  CLI::Option* world_size = command->add_option("--world-size", args->world_size, "Processes");
  CLI::Option* local_rank = command->add_option("--local-rank", args->local_rank, "Rank on node");
  CLI::Option* nproc = command->add_option("--nproc-per-node", args->nproc_per_node,
                                           "Workers per node (resolves as the per-node agent)");
  CLI::Option* node_rank = command->add_option("--node-rank", args->node_rank, "Node index");
  CLI::Option* num_nodes = command->add_option("--nnodes", args->num_nodes, "Nodes");
  CLI::Option* master_addr =
      command->add_option("--master-addr", args->master_addr, "Rank 0's host");
  CLI::Option* master_port =
      command->add_option("--master-port", args->master_port, "Rendezvous port");
  CLI::Option* run_id = command->add_option("--run-id", args->run_id, "Run name");
  CLI::Option* max_restarts =
      command->add_option("--max-restarts", args->max_restarts, "Restarts the agent allows")
          ->check(NonNegative());
  command->add_flag("--uses-gpus", args->uses_gpus,
                    "Check that the local processes fit on the node's GPUs");
  command->add_flag("--check-master", args->check_master,
                    "Also check that the master address resolves (DNS)");
  command->callback([=] {
    WorldOverrides flags;
    flags.uses_gpus = args->uses_gpus;
    if (rank->count() > 0) flags.rank = args->rank;
    if (world_size->count() > 0) flags.world_size = args->world_size;
    if (local_rank->count() > 0) flags.local_rank = args->local_rank;
    if (nproc->count() > 0) flags.nproc_per_node = args->nproc_per_node;
    if (node_rank->count() > 0) flags.node_rank = args->node_rank;
    if (num_nodes->count() > 0) flags.num_nodes = args->num_nodes;
    if (master_addr->count() > 0) flags.master_addr = args->master_addr;
    if (master_port->count() > 0) flags.master_port = args->master_port;
    if (run_id->count() > 0) flags.run_id = args->run_id;
    if (max_restarts->count() > 0) flags.max_restarts = args->max_restarts;
    absl::StatusOr<WorldEnvironment> world = ResolveWorld(ProcessEnvironment(), flags);
    if (!world.ok()) Fail(world.status(), kExitUsage);
    if (args->json) {
      if (absl::Status utf8 = CheckFieldsAreUtf8(*world); !utf8.ok()) Fail(utf8, kExitUsage);
      std::cout << WorldJson(*world).dump(2) << "\n";
    } else {
      std::cout << WorldText(*world);
    }
    if (args->check_master) {
      if (absl::Status resolves = CheckMasterResolves(*world); !resolves.ok()) {
        Fail(resolves, kExitFailure);
      }
    }
  });
}

}  // namespace dtrain::cli
