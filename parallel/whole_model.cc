#include "parallel/whole_model.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/util/status.h"
#include "parallel/comm/host_values.h"

namespace dtrain {
namespace {

// `own` (the layout of ParamTable(config, slices[comm.rank()])) -> `target`'s layout, where rank
// r of `comm` holds slices[r]: all-gathered, each rank's values padded to the largest table (the
// slices' sizes differ: vocabulary slots, stages), then each rank's counted elements placed.
// Elements of `target` no rank counts (a stage's tied head copy) stay 0.
absl::StatusOr<std::vector<float>> GatherSplit(const ParamTable& target,
                                               const std::vector<ModelSlice>& slices,
                                               const std::vector<float>& own, Backend& backend,
                                               Communicator& comm) {
  std::vector<ParamTable> sources;
  size_t largest = 0;
  for (const ModelSlice& slice : slices) {
    sources.emplace_back(target.config(), slice);
    largest = std::max(largest, sources.back().total_numel());
  }
  std::vector<float> padded(largest);
  std::copy(own.begin(), own.end(), padded.begin());
  std::vector<float> gathered(largest * comm.size());
  RETURN_IF_ERROR(AllGatherHost(comm, backend, padded.data(), gathered.data(), largest));
  std::vector<float> assembled(target.total_numel());
  for (int rank = 0; rank < comm.size(); ++rank) {
    const float* values = gathered.data() + rank * largest;
    const std::vector<std::pair<size_t, size_t>> counted = sources[rank].CountedRanges();
    ForEachShardRun(target, sources[rank], [&](size_t from, size_t to, size_t count) {
      // The counted ranges (ascending, disjoint) that overlap [from, from + count).
      auto range = std::upper_bound(counted.begin(), counted.end(), from,
                                    [](size_t index, const auto& r) { return index < r.second; });
      for (; range != counted.end() && range->first < from + count; ++range) {
        const size_t lo = std::max(from, range->first);
        const size_t hi = std::min(from + count, range->second);
        std::copy(values + lo, values + hi, assembled.begin() + to + (lo - from));
      }
    });
  }
  return assembled;
}

}  // namespace

absl::StatusOr<std::vector<float>> GatherWholeModel(const ParamTable& table, std::vector<float> own,
                                                    Backend& backend, Communicator* tp,
                                                    Communicator* pp) {
  ModelSlice stage = table.slice();
  if (tp != nullptr) {
    std::vector<ModelSlice> slices(tp->size(), stage);
    for (int rank = 0; rank < tp->size(); ++rank) slices[rank].tp_rank = rank;
    stage.tp_rank = 0;
    stage.tp_size = 1;
    ASSIGN_OR_RETURN(own,
                     GatherSplit(ParamTable(table.config(), stage), slices, own, backend, *tp));
  }
  if (pp != nullptr) {
    // Each stage's chunks, from the stages themselves (every stage holds as many).
    const std::vector<BlockSpan>& chunks = table.chunks();
    std::vector<int64_t> spans;
    for (const BlockSpan& chunk : chunks) spans.insert(spans.end(), {chunk.first, chunk.count});
    std::vector<int64_t> stage_spans(spans.size() * pp->size());
    RETURN_IF_ERROR(AllGatherHost(*pp, backend, spans.data(), stage_spans.data(), spans.size()));
    std::vector<ModelSlice> slices(pp->size());
    for (int s = 0; s < pp->size(); ++s) {
      for (size_t k = 0; k < chunks.size(); ++k) {
        const int64_t* span = stage_spans.data() + (s * chunks.size() + k) * 2;
        slices[s].chunks.push_back({static_cast<int>(span[0]), static_cast<int>(span[1])});
      }
    }
    ASSIGN_OR_RETURN(own, GatherSplit(ParamTable(table.config(), {}), slices, own, backend, *pp));
  }
  return own;
}

}  // namespace dtrain
