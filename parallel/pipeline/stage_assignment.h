// Which transformer blocks each pipeline stage runs: contiguous blocks per model chunk, balanced
// on per-block costs, with the embedding on the first model chunk and the final norm, head and
// loss on the last (schedule.h's placement: stage s holds model chunks s, s + stages, ...).
//
// Pure and thread-safe. Costs are in any one unit (the planner's are training FLOPs per token,
// cost_model.h's PipelineFlopsPerToken).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"

namespace dtrain {

struct PipelineCosts {
  double embedding = 0;        // carried by model chunk 0
  std::vector<double> blocks;  // one per transformer block, in model order
  double head = 0;             // final norm, head and loss: carried by the last model chunk
};

struct StageAssignment {
  int stages = 1;
  int virtual_stages = 1;
  // Model chunk k = chunk * stages + stage runs blocks [first_block[k], first_block[k + 1]);
  // stages * virtual_stages + 1 entries, first_block[0] = 0 and the last = the block count.
  std::vector<int> first_block;
  std::vector<double> chunk_costs;  // per model chunk, its blocks plus embedding / head

  int model_chunks() const { return stages * virtual_stages; }
  // The sum over the stage's chunks.
  double StageCost(int stage) const;
};

// Minimises the largest model chunk cost (with one virtual stage: the slowest stage, the pace
// of the pipeline); every chunk gets at least one block. Among the assignments that reach the
// minimum, later chunks take as many blocks as fit, because under 1F1B stage s holds p - s
// micro-batches' activations: the first stages, which hold the most, get the fewest blocks.
// Errors (InvalidArgument): fewer blocks than stages x virtual stages, naming model.n_layer,
// parallel.pp and parallel.pp_virtual_stages; stages or virtual stages below 1; a negative or
// non-finite cost.
absl::StatusOr<StageAssignment> AssignStages(const PipelineCosts& costs, int stages,
                                             int virtual_stages);

// The model chunks `stage` runs, in model order: ModelSlice::chunks for the stage.
std::vector<BlockSpan> StageChunks(const StageAssignment& assignment, int stage);

// One line for logs and `dtrain plan`: "stage 0: embedding + blocks 0-9; stage 1: blocks 10-19
// + head"; a stage with several chunks lists them in order, separated by commas.
std::string FormatStageAssignment(const StageAssignment& assignment);

}  // namespace dtrain
