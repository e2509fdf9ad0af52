#include "parallel/whole_model.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/util/status.h"
#include "parallel/comm/host_values.h"

namespace dtrain {
namespace {

// `own` (the layout of ParamTable(config, slices[comm.rank()])) -> `target`'s layout on rank 0
// of `comm`, where rank r holds slices[r]: each rank's values sent to rank 0 in turn and their
// counted elements placed. Elements of `target` no rank counts (a stage's tied head copy) stay 0.
// The other ranks get an empty vector.
absl::StatusOr<std::vector<float>> GatherSplit(const ParamTable& target,
                                               const std::vector<ModelSlice>& slices,
                                               const std::vector<float>& own, Backend& backend,
                                               Communicator& comm) {
  std::vector<ParamTable> sources;
  std::vector<size_t> counts;
  for (const ModelSlice& slice : slices) {
    sources.emplace_back(target.config(), slice);
    counts.push_back(sources.back().total_numel());
  }
  std::vector<float> assembled(comm.rank() == 0 ? target.total_numel() : 0);
  RETURN_IF_ERROR(
      GatherHost(comm, backend, own.data(), counts, /*root=*/0, [&](int rank, const float* values) {
        const std::vector<std::pair<size_t, size_t>> counted = sources[rank].CountedRanges();
        ForEachShardRun(target, sources[rank], [&](size_t from, size_t to, size_t count) {
          // The counted ranges (ascending, disjoint) that overlap [from, from + count).
          auto range =
              std::upper_bound(counted.begin(), counted.end(), from,
                               [](size_t index, const auto& r) { return index < r.second; });
          for (; range != counted.end() && range->first < from + count; ++range) {
            const size_t lo = std::max(from, range->first);
            const size_t hi = std::min(from + count, range->second);
            std::copy(values + lo, values + hi, assembled.begin() + to + (lo - from));
          }
        });
      }));
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
    // The stage is whole on tp rank 0 alone, whose pipeline group assembles the model.
    if (tp->rank() != 0) return own;
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
