#include "parallel/comm/host_values.h"

#include <algorithm>
#include <vector>

#include "core/util/status.h"

namespace dtrain {
namespace {

// Runs `collective` on a backend buffer of `in_count` values copied from `in`, then copies
// `out_count` values of its result (`out_offset` values in) back to `out`. Nothing to move,
// nothing runs.
template <typename Collective>
absl::Status ThroughBackend(Backend& backend, DataType type, const void* in, size_t in_count,
                            void* out, size_t out_offset, size_t out_count,
                            const Collective& collective) {
  const size_t size = std::max(in_count, out_offset + out_count);
  if (size == 0) return absl::OkStatus();
  const size_t bytes = DataTypeBytes(type);
  DeviceBuffer staged = backend.Allocate(size, type);
  if (in_count > 0) backend.CopyFromHost(staged.data(), in, in_count * bytes);
  RETURN_IF_ERROR(
      collective(staged.data(), static_cast<char*>(staged.data()) + out_offset * bytes)->Wait());
  if (out_count > 0) {
    backend.CopyToHost(out, static_cast<char*>(staged.data()) + out_offset * bytes,
                       out_count * bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduceHost(Communicator& group, Backend& backend, void* values, size_t count,
                           DataType type, ReduceOp op) {
  return ThroughBackend(backend, type, values, count, values, 0, count, [&](void* staged, void*) {
    return group.AllReduce(staged, count, type, op);
  });
}

absl::Status AllGatherHost(Communicator& group, Backend& backend, const void* own, void* all,
                           size_t count, DataType type) {
  // One buffer: this rank's values, then the gathered ones.
  return ThroughBackend(
      backend, type, own, count, all, count, count * group.size(),
      [&](void* staged, void* gathered) { return group.AllGather(staged, gathered, count, type); });
}

absl::Status BroadcastHost(Communicator& group, Backend& backend, void* values, size_t count,
                           DataType type, int root) {
  return ThroughBackend(backend, type, values, count, values, 0, count, [&](void* staged, void*) {
    return group.Broadcast(staged, count, type, root);
  });
}

absl::Status GatherHost(Communicator& group, Backend& backend, const float* own,
                        absl::Span<const size_t> counts, int root,
                        absl::FunctionRef<void(int rank, const float* values)> receive,
                        size_t chunk) {
  const int me = group.rank();
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  std::vector<float> values(me == root ? largest : 0);
  DeviceBuffer staged =
      backend.Allocate(std::max<size_t>(1, std::min(chunk, largest)), DataType::kF32);
  constexpr size_t kBytes = sizeof(float);
  for (int rank = 0; rank < group.size(); ++rank) {
    if (rank == root) {
      if (me == root) receive(rank, own);
      continue;
    }
    for (size_t begin = 0; begin < counts[rank]; begin += chunk) {
      const size_t count = std::min(chunk, counts[rank] - begin);
      if (me == rank) backend.CopyFromHost(staged.data(), own + begin, count * kBytes);
      RETURN_IF_ERROR(group.Broadcast(staged.data(), count, DataType::kF32, rank)->Wait());
      if (me == root) backend.CopyToHost(values.data() + begin, staged.data(), count * kBytes);
    }
    if (me == root) receive(rank, values.data());
  }
  return absl::OkStatus();
}

absl::Status SumOverGroup(Communicator* group, Backend& backend, double& a, double& b) {
  if (group == nullptr) return absl::OkStatus();
  double sums[2] = {a, b};
  RETURN_IF_ERROR(AllReduceHost(*group, backend, sums, 2, ReduceOp::kSum));
  a = sums[0];
  b = sums[1];
  return absl::OkStatus();
}

}  // namespace dtrain
