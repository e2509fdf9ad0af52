#include "parallel/comm/host_values.h"

#include "core/util/status.h"

namespace dtrain {

absl::Status AllReduceHost(Communicator& group, Backend& backend, void* values, size_t count,
                           DataType type, ReduceOp op) {
  if (count == 0) return absl::OkStatus();
  DeviceBuffer staged = backend.Allocate(count, type);
  backend.CopyFromHost(staged.data(), values, staged.bytes());
  RETURN_IF_ERROR(group.AllReduce(staged.data(), count, type, op)->Wait());
  backend.CopyToHost(values, staged.data(), staged.bytes());
  return absl::OkStatus();
}

absl::Status AllGatherHost(Communicator& group, Backend& backend, const void* own, void* all,
                           size_t count, DataType type) {
  if (count == 0) return absl::OkStatus();
  DeviceBuffer staged_own = backend.Allocate(count, type);
  DeviceBuffer staged_all = backend.Allocate(count * group.size(), type);
  backend.CopyFromHost(staged_own.data(), own, staged_own.bytes());
  RETURN_IF_ERROR(group.AllGather(staged_own.data(), staged_all.data(), count, type)->Wait());
  backend.CopyToHost(all, staged_all.data(), staged_all.bytes());
  return absl::OkStatus();
}

absl::Status BroadcastHost(Communicator& group, Backend& backend, void* values, size_t count,
                           DataType type, int root) {
  if (count == 0) return absl::OkStatus();
  DeviceBuffer staged = backend.Allocate(count, type);
  backend.CopyFromHost(staged.data(), values, staged.bytes());
  RETURN_IF_ERROR(group.Broadcast(staged.data(), count, type, root)->Wait());
  backend.CopyToHost(values, staged.data(), staged.bytes());
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
