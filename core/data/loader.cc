#include "core/data/loader.h"

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::Status CheckBatchShares(int global_batch, int world) {
  if (global_batch > 0 && global_batch % world == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("train.batch_size ", global_batch,
                                                 " is not a positive multiple of the ", world,
                                                 " data-parallel ranks; make it one"));
}

absl::StatusOr<LoaderState> MergeLoaderStates(const std::vector<LoaderState>& ranks) {
  if (ranks.empty()) return absl::InvalidArgumentError("no data loader states to merge");
  LoaderState merged{ranks[0].consumed_sequences, ""};
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    if (ranks[rank].consumed_sequences != merged.consumed_sequences) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data loader states disagree: rank 0 consumed ", merged.consumed_sequences,
          " sequences, rank ", rank, " ", ranks[rank].consumed_sequences,
          "; they are from different steps, so restore all ranks from one checkpoint"));
    }
    merged.cursor += ranks[rank].cursor;
  }
  return merged;
}

}  // namespace dtrain
