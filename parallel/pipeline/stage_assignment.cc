#include "parallel/pipeline/stage_assignment.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

// Cuts blocks into `chunks` contiguous, non-empty chunks of cost at most `bound`, filling from
// the back: each chunk, from the last, takes as many blocks as fit while leaving one for every
// chunk before it. Returns the chunk starts (chunks + 1 entries), or an empty vector when the
// cut needs more chunks than that. Filling greedily from the back needs the fewest chunks for a
// bound (a chunk that reaches further back leaves a shorter, cheaper prefix), so this finds a
// cut exactly when one exists.
std::vector<int> CutFromTheBack(const PipelineCosts& costs, int chunks, double bound) {
  const int n = static_cast<int>(costs.blocks.size());
  std::vector<int> starts(chunks + 1, 0);
  starts[chunks] = n;
  int end = n;
  for (int chunk = chunks - 1; chunk >= 0; --chunk) {
    if (end == 0) return {};
    double cost = chunk == chunks - 1 ? costs.head : 0;
    int start = end;
    // The chunk that holds block 0 also holds the embedding; the first chunk must take all.
    const int lowest = chunk == 0 ? 0 : chunk;  // leaves a block for each earlier chunk
    while (start > lowest) {
      const double with = cost + costs.blocks[start - 1] + (start - 1 == 0 ? costs.embedding : 0);
      if (with > bound && start < end) break;
      cost = with;
      --start;
    }
    if (cost > bound) return {};
    starts[chunk] = start;
    end = start;
  }
  return end == 0 ? starts : std::vector<int>{};
}

double ChunkCost(const PipelineCosts& costs, const std::vector<int>& starts, int chunk) {
  double cost = 0;
  for (int b = starts[chunk]; b < starts[chunk + 1]; ++b) cost += costs.blocks[b];
  if (chunk == 0) cost += costs.embedding;
  if (chunk + 1 == static_cast<int>(starts.size()) - 1) cost += costs.head;
  return cost;
}

std::string BlockRange(int first, int end) {
  return end - first == 1 ? absl::StrCat("block ", first)
                          : absl::StrCat("blocks ", first, "-", end - 1);
}

}  // namespace

double StageAssignment::StageCost(int stage) const {
  double cost = 0;
  for (int chunk = 0; chunk < virtual_stages; ++chunk) cost += chunk_costs[chunk * stages + stage];
  return cost;
}

absl::StatusOr<StageAssignment> AssignStages(const PipelineCosts& costs, int stages,
                                             int virtual_stages) {
  if (stages < 1 || virtual_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pp = ", stages, " and parallel.pp_virtual_stages = ", virtual_stages,
                     ": both must be at least 1"));
  }
  const int n = static_cast<int>(costs.blocks.size());
  const int chunks = stages * virtual_stages;
  if (n < chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.n_layer = ", n, " blocks cannot fill parallel.pp x parallel.pp_virtual_stages = ",
        stages, " x ", virtual_stages, " = ", chunks,
        " model chunks of at least one block each; lower pp or pp_virtual_stages"));
  }
  double total = costs.embedding + costs.head;
  for (double cost : costs.blocks) total += cost;
  const auto bad = [](double cost) { return !std::isfinite(cost) || cost < 0; };
  if (bad(costs.embedding) || bad(costs.head) ||
      std::any_of(costs.blocks.begin(), costs.blocks.end(), bad)) {
    return absl::InvalidArgumentError("pipeline stage costs must be finite and non-negative");
  }
  // Bisect the bound on the largest chunk: `high` always has a cut, `low` never (or is 0).
  double low = 0, high = total;
  for (int i = 0; i < 200 && high - low > 1e-12 * high; ++i) {
    const double middle = low + (high - low) / 2;
    if (CutFromTheBack(costs, chunks, middle).empty()) {
      low = middle;
    } else {
      high = middle;
    }
  }
  StageAssignment assignment;
  assignment.stages = stages;
  assignment.virtual_stages = virtual_stages;
  assignment.first_block = CutFromTheBack(costs, chunks, high);
  for (int chunk = 0; chunk < chunks; ++chunk) {
    assignment.chunk_costs.push_back(ChunkCost(costs, assignment.first_block, chunk));
  }
  return assignment;
}

std::vector<BlockSpan> StageChunks(const StageAssignment& assignment, int stage) {
  std::vector<BlockSpan> chunks;
  for (int chunk = 0; chunk < assignment.virtual_stages; ++chunk) {
    const int k = chunk * assignment.stages + stage;
    chunks.push_back(
        {assignment.first_block[k], assignment.first_block[k + 1] - assignment.first_block[k]});
  }
  return chunks;
}

std::string FormatStageAssignment(const StageAssignment& assignment) {
  std::vector<std::string> stages;
  for (int stage = 0; stage < assignment.stages; ++stage) {
    std::vector<std::string> chunks;
    for (int chunk = 0; chunk < assignment.virtual_stages; ++chunk) {
      const int k = chunk * assignment.stages + stage;
      std::string text = BlockRange(assignment.first_block[k], assignment.first_block[k + 1]);
      if (k == 0) text = absl::StrCat("embedding + ", text);
      if (k == assignment.model_chunks() - 1) absl::StrAppend(&text, " + head");
      chunks.push_back(text);
    }
    stages.push_back(absl::StrCat("stage ", stage, ": ", absl::StrJoin(chunks, ", ")));
  }
  return absl::StrJoin(stages, "; ");
}

}  // namespace dtrain
