// What one training rank allocates, estimated before it allocates anything, and the check that
// it fits the machine: a model too large for this machine is an error naming the bytes and the
// keys to change, not an allocation failure or the kernel's OOM killer halfway through setup.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/backend/backend.h"
#include "core/model/model_config.h"
#include "core/model/param_table.h"
#include "core/model/recompute.h"
#include "core/recipe/recipe.h"
#include "parallel/sharding.h"

namespace dtrain {

// Bytes one rank keeps for the run, in its precision (Precision::Trainer: bf16 parameters and
// activations at run.precision bf16). The model state follows the ZeRO formulas of the planner
// (parallel/planner/cost_model.h) for the strategy and world size; the step's buffers are the
// data-parallel engine's, from its unit layout (EstimateStepBuffers).
struct RankMemory {
  double parameter_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  double activation_bytes = 0;
  double buffer_bytes = 0;

  double model_state_bytes() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
  double total_bytes() const { return model_state_bytes() + activation_bytes + buffer_bytes; }
};

// `dp_size` ranks share the state of the part of the model `slice` holds (a tensor-parallel
// shard holds its heads' and MLP columns' share and the replicated tensors); a pipeline stage
// keeps `activation_slots` micro-batches' activations (PipelineActivationSlots).
RankMemory EstimateRankMemory(const Recipe& recipe, const ModelConfig& config,
                              const ShardingStrategy& strategy, Recompute recompute, int dp_size,
                              const ModelSlice& slice = {}, int activation_slots = 1);

// ResourceExhausted when a rank's `memory` does not fit what its backend has (`available`, which
// the `local_world_size` ranks on this machine share when it is the machine's RAM), naming each
// part, the memory, the planner's layout of recipe for the `world_size` ranks that fits it
// (FittingLayoutHint) and what else to change; OK otherwise.
absl::Status CheckRankMemory(const Recipe& recipe, const RankMemory& memory,
                             const Backend::Memory& available, const ShardingStrategy& strategy,
                             int dp_size, int world_size, int local_world_size);

// train.export_to gathers the whole model in float32 on rank 0 at the end of the run, and holds
// it about twice (assembled, and the stage or slice being received; ExportWeights):
// FailedPrecondition, asking for exit code kExitUsage, when the machine of rank 0
// (`holds_rank_zero`, of `machine_bytes`) cannot hold that, so that the run stops before its
// steps rather than after; OK otherwise and without export_to. A lower bound: the run's own
// memory comes on top (the check above counts that).
absl::Status CheckExportFitsMachine(const Recipe& recipe, const ModelConfig& config,
                                    bool holds_rank_zero, double machine_bytes);

// "1.5 GiB", "3.2 TiB": bytes for messages.
std::string FormatBytes(double bytes);

}  // namespace dtrain
