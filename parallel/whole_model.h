// The whole model's parameters from the slices the ranks hold (tensor-parallel shards, pipeline
// stages), for what needs the model in one piece: the trainer's export of its weights.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "core/backend/backend.h"
#include "core/model/param_table.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

// Calls fn(shard_index, whole_index, count) for the runs of a slice's table (`shard`) that are
// contiguous in `whole`, a table of whole tensors holding every tensor of the slice's (the whole
// model's, ParamTable(config, {}), or a stage's at tensor-parallel size 1): shard element
// shard_index + i is whole element whole_index + i, for i < count.
template <typename F>
void ForEachShardRun(const ParamTable& whole, const ParamTable& shard, F&& fn) {
  for (const TensorEntry& entry : shard.entries()) {
    const size_t whole_offset = whole.Find(entry.name)->offset;
    ForEachGlobalRun(entry, 0, entry.numel, [&](size_t local, size_t global, size_t count) {
      fn(entry.offset + local, whole_offset + global, count);
    });
  }
}

// The whole model's parameters (ParamTable(table.config(), {}) layout) from `own`, this rank's
// values of `table`'s slice (complete: already gathered over the data-parallel ranks): gathered
// over the tensor-parallel group `tp` into the stage's whole tensors, then over the pipeline
// group `pp` (rank s holding stage s) into the whole model. A null group is a group of one.
// Every rank of both groups calls it; rank 0 of both (tp rank 0 of the first stage) gets the
// whole model, each other rank an empty vector, and no rank holds more than its own values
// besides (one rank's at a time, received by rank 0). Each element comes from the one
// rank that counts it (ParamTable::CountedRanges): a replicated tensor from tp rank 0, GPT-2's
// tied embedding from the first stage, never from the last stage's head copy. The groups work on
// `backend`'s memory, through which the values travel (host_values.h).
// Errors: a failed send or receive (the result is then unusable).
absl::StatusOr<std::vector<float>> GatherWholeModel(const ParamTable& table, std::vector<float> own,
                                                    Backend& backend, Communicator* tp,
                                                    Communicator* pp);

}  // namespace dtrain
