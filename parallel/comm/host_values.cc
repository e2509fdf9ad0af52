#include "parallel/comm/host_values.h"

#include "core/util/status.h"

namespace dtrain {
namespace {

// Runs `collective` on a backend buffer of `in_count` values copied from `in`, then copies
// `out_count` values of its result (`out_offset` values in) back to `out`.
template <typename Collective>
absl::Status ThroughBackend(Backend& backend, DataType type, const void* in, size_t in_count,
                            void* out, size_t out_offset, size_t out_count,
                            const Collective& collective) {
  if (out_count == 0) return absl::OkStatus();
  const size_t bytes = DataTypeBytes(type);
  DeviceBuffer staged = backend.Allocate(out_offset + out_count, type);
  backend.CopyFromHost(staged.data(), in, in_count * bytes);
  RETURN_IF_ERROR(
      collective(staged.data(), static_cast<char*>(staged.data()) + out_offset * bytes)->Wait());
  backend.CopyToHost(out, static_cast<char*>(staged.data()) + out_offset * bytes,
                     out_count * bytes);
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

absl::Status SumOverGroup(Communicator* group, Backend& backend, double& a, double& b) {
  if (group == nullptr) return absl::OkStatus();
  double sums[2] = {a, b};
  RETURN_IF_ERROR(AllReduceHost(*group, backend, sums, 2, ReduceOp::kSum));
  a = sums[0];
  b = sums[1];
  return absl::OkStatus();
}

}  // namespace dtrain
