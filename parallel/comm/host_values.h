// Host values over a group whose collectives run on backend memory (the mesh groups,
// backend_memory_guard.h): each call copies the values into a buffer of `backend`, runs the
// collective there, waits, and copies the result back. For the few values a group must agree on
// (the step's and evaluation's sums, fingerprints, sampled logits, exported weights); the
// model's tensors are backend memory already and travel as they are.
#pragma once

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/backend/backend.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

// values (count): reduced over the group.
absl::Status AllReduceHost(Communicator& group, Backend& backend, void* values, size_t count,
                           DataType type, ReduceOp op);
// own (count) -> all (group.size() * count), rank r's at all[r * count].
absl::Status AllGatherHost(Communicator& group, Backend& backend, const void* own, void* all,
                           size_t count, DataType type);
// values (count): root's replace everyone else's.
absl::Status BroadcastHost(Communicator& group, Backend& backend, void* values, size_t count,
                           DataType type, int root);

template <typename T>
absl::Status AllReduceHost(Communicator& group, Backend& backend, T* values, size_t count,
                           ReduceOp op) {
  return AllReduceHost(group, backend, static_cast<void*>(values), count, DataTypeOf<T>(), op);
}
template <typename T>
absl::Status AllGatherHost(Communicator& group, Backend& backend, const T* own, T* all,
                           size_t count) {
  return AllGatherHost(group, backend, static_cast<const void*>(own), static_cast<void*>(all),
                       count, DataTypeOf<T>());
}
template <typename T>
absl::Status BroadcastHost(Communicator& group, Backend& backend, T* values, size_t count,
                           int root) {
  return BroadcastHost(group, backend, static_cast<void*>(values), count, DataTypeOf<T>(), root);
}

// Every rank's values to `root`, one rank at a time: rank r sends `counts[r]` values (`own`),
// and root calls receive(r, values) for each rank in order, its own included. The values travel
// as broadcasts of at most `chunk` values, which every group runs (NCCL sends only between a
// pipeline group's neighbours): the backend holds one chunk, root's host one rank's values.
inline constexpr size_t kGatherChunk = size_t{1} << 24;  // 64 MiB of floats
absl::Status GatherHost(Communicator& group, Backend& backend, const float* own,
                        absl::Span<const size_t> counts, int root,
                        absl::FunctionRef<void(int rank, const float* values)> receive,
                        size_t chunk = kGatherChunk);

// SumOverRanks (communicator.h) over a group of backend memory: a and b summed over `group`
// (null: unchanged), in double.
absl::Status SumOverGroup(Communicator* group, Backend& backend, double& a, double& b);

}  // namespace dtrain
