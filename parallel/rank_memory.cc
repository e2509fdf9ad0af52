#include "parallel/rank_memory.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/param_table.h"
#include "core/util/exit_codes.h"
#include "parallel/planner/auto_layout.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/plan_report.h"

namespace dtrain {
namespace {

// The planner's strategy with the same sharding (zero3 and fsdp shard alike).
Strategy PlannerStrategy(Sharding sharding) {
  switch (sharding) {
    case Sharding::kNone:
      return Strategy::kDdp;
    case Sharding::kOptimizer:
      return Strategy::kZero1;
    case Sharding::kGradients:
      return Strategy::kZero2;
    case Sharding::kParameters:
      break;
  }
  return Strategy::kZero3;
}

}  // namespace

RankMemory EstimateRankMemory(const Recipe& recipe, const ModelConfig& config,
                              const ShardingStrategy& strategy, Recompute recompute, int dp_size,
                              const ModelSlice& slice, int activation_slots) {
  const ParamTable table(config, slice);
  const double parameters = static_cast<double>(table.total_numel());
  const Precision precision = Precision::Trainer(strategy.param_type == DataType::kBF16);
  const MemoryEstimate state = ModelStateBytes(PlannerStrategy(strategy.sharding), parameters,
                                               dp_size, precision, /*offload=*/false);
  RankMemory memory;
  memory.parameter_bytes = state.param_bytes;
  memory.gradient_bytes = state.grad_bytes;
  memory.optimizer_bytes = state.optimizer_bytes;
  memory.activation_bytes =
      StageActivationBytes(config, recipe.train.micro_batch, recipe.train.seq_len, recompute, slice,
                           recipe.parallel.sequence_parallel, activation_slots,
                           precision.activation_bytes, recipe.cuda());
  memory.buffer_bytes =
      EstimateStepBuffers(table, strategy, dp_size, recipe.parallel.pp > 1).total_bytes();
  return memory;
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

namespace {

// The planner's layout for `world_size` ranks (`local_world_size` a machine) of
// `bytes_per_rank` each, as the --set options that select it; or why there is none, and what
// adds memory: more ranks, or more machines where a machine's ranks share its memory (`shared`).
std::string FittingLayoutHint(const Recipe& recipe, int world_size, int local_world_size,
                              double bytes_per_rank, bool shared) {
  const absl::StatusOr<Plan> plan =
      PlanForMemory(recipe, world_size / local_world_size, local_world_size, bytes_per_rank,
                    TrainerLayouts(local_world_size));
  if (!plan.ok()) {
    return absl::StrCat("the planner cannot search layouts for this recipe: ",
                        plan.status().message());
  }
  const std::string ranks = absl::StrCat(world_size, world_size == 1 ? " rank of " : " ranks of ",
                                         FormatBytes(bytes_per_rank));
  const Candidate* fitting = plan->recommendation();
  if (fitting == nullptr) {
    return absl::StrCat("the planner finds no layout for ", ranks, ": ",
                        shared ? "add machines (the ranks of one share its memory)" : "add ranks",
                        " and shard the state over them (parallel.strategy: zero3), or make the "
                        "model smaller (model.n_layer, model.d_model)");
  }
  std::string options;
  for (const auto& [key, value] : LayoutSettings(fitting->layout)) {
    absl::StrAppend(&options, options.empty() ? "" : " ", "--set ", key, "=", value);
  }
  return absl::StrCat("the planner's layout for ", ranks, ": ", DescribeLayout(fitting->layout),
                      " (", options, ")");
}

}  // namespace

absl::Status CheckExportFitsMachine(const Recipe& recipe, const ModelConfig& config,
                                    bool holds_rank_zero, double machine_bytes) {
  if (recipe.train.export_to.empty() || !holds_rank_zero) return absl::OkStatus();
  const double whole = sizeof(float) * static_cast<double>(ParamTable(config, {}).total_numel());
  if (2 * whole <= machine_bytes) return absl::OkStatus();
  return WithExitCode(
      absl::FailedPreconditionError(absl::StrCat(
          "train.export_to ", recipe.train.export_to,
          " gathers the whole model on rank 0 at the end of the run, about twice over in float32: ",
          FormatBytes(2 * whole), ", more than this machine's ", FormatBytes(machine_bytes),
          "; set train.export_to: \"\" and export the last checkpoint with `dtrain ckpt export` "
          "on a machine with the memory")),
      kExitUsage);
}

absl::Status CheckRankMemory(const Recipe& recipe, const RankMemory& memory,
                             const Backend::Memory& available, const ShardingStrategy& strategy,
                             int dp_size, int world_size, int local_world_size) {
  const int sharing = available.shared_by_local_ranks ? local_world_size : 1;
  const double needed = memory.total_bytes() * sharing;
  if (needed <= available.bytes) return absl::OkStatus();
  const std::string fitting =
      FittingLayoutHint(recipe, world_size, local_world_size, available.bytes / sharing,
                        available.shared_by_local_ranks);
  // More than the device holds at all: exit 2, which the agent does not restart. Within it, the
  // free memory may be another process's for now (a GPU's, until the last attempt's workers end).
  const bool never_fits = available.capacity > 0 && needed > available.capacity;
  const absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      sharing == 1 ? ""
                   : absl::StrCat(sharing, " ranks on ", available.name, " need ",
                                  FormatBytes(memory.total_bytes() * sharing), "; "),
      "one rank needs ", FormatBytes(memory.total_bytes()), " (parameters ",
      FormatBytes(memory.parameter_bytes), ", gradients ", FormatBytes(memory.gradient_bytes),
      ", optimizer ", FormatBytes(memory.optimizer_bytes), " with ", strategy.name, " over ",
      dp_size, dp_size == 1 ? " rank" : " ranks", "; activations ",
      FormatBytes(memory.activation_bytes), "; step buffers ", FormatBytes(memory.buffer_bytes),
      ") but ", available.name, " has ", FormatBytes(available.bytes),
      available.shared_by_local_ranks ? "" : " free", "; ", fitting));
  return never_fits ? WithExitCode(status, kExitUsage) : status;
}

}  // namespace dtrain
