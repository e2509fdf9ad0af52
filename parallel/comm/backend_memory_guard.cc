#include "parallel/comm/backend_memory_guard.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/status.h"

namespace dtrain {

BackendMemoryGuard::BackendMemoryGuard(std::unique_ptr<Communicator> inner, const Backend& backend,
                                       bool point_to_point)
    : owned_(std::move(inner)),
      inner_(*owned_),
      name_(inner_.name()),
      backend_(backend),
      point_to_point_(point_to_point) {}

BackendMemoryGuard::BackendMemoryGuard(Communicator& inner, std::string name,
                                       const Backend& backend, bool point_to_point)
    : inner_(inner), name_(std::move(name)), backend_(backend), point_to_point_(point_to_point) {}

absl::Status BackendMemoryGuard::Check(const char* op_name, const char* role, const void* data,
                                       size_t count, DataType type) const {
  if (backend_.Holds(data, count * DataTypeBytes(type))) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      op_name, " on the ", name_, " group was handed ", role, " (", count, " ", DataTypeName(type),
      " values) outside the backend's memory: this group's collectives run on "
      "device memory (NCCL on GPUs), so host values must cross through a backend buffer; a bug "
      "in dtrain, please report it"));
}

absl::Status BackendMemoryGuard::CheckPair(const char* op_name, const void* data, size_t count,
                                           DataType type, int peer) const {
  RETURN_IF_ERROR(
      CheckPointToPoint(point_to_point_, inner_.rank(), inner_.size(), peer, op_name, name_));
  return Check(op_name, "its buffer", data, count, type);
}

std::unique_ptr<Work> BackendMemoryGuard::AllReduce(void* data, size_t count, DataType type,
                                                    ReduceOp op) {
  if (absl::Status s = Check("all_reduce", "its buffer", data, count, type); !s.ok()) {
    return FinishedWork(s);
  }
  return inner_.AllReduce(data, count, type, op);
}

std::unique_ptr<Work> BackendMemoryGuard::ReduceScatter(const void* input, void* output,
                                                        size_t count, DataType type, ReduceOp op) {
  absl::Status s = Check("reduce_scatter", "its input", input, count * inner_.size(), type);
  if (s.ok()) s = Check("reduce_scatter", "its output", output, count, type);
  if (!s.ok()) return FinishedWork(s);
  return inner_.ReduceScatter(input, output, count, type, op);
}

std::unique_ptr<Work> BackendMemoryGuard::AllGather(const void* input, void* output, size_t count,
                                                    DataType type) {
  absl::Status s = Check("all_gather", "its input", input, count, type);
  if (s.ok()) s = Check("all_gather", "its output", output, count * inner_.size(), type);
  if (!s.ok()) return FinishedWork(s);
  return inner_.AllGather(input, output, count, type);
}

std::unique_ptr<Work> BackendMemoryGuard::Broadcast(void* data, size_t count, DataType type,
                                                    int root) {
  if (absl::Status s = Check("broadcast", "its buffer", data, count, type); !s.ok()) {
    return FinishedWork(s);
  }
  return inner_.Broadcast(data, count, type, root);
}

std::unique_ptr<Work> BackendMemoryGuard::Send(const void* data, size_t count, DataType type,
                                               int peer) {
  if (absl::Status s = CheckPair("send", data, count, type, peer); !s.ok()) {
    return FinishedWork(s);
  }
  return inner_.Send(data, count, type, peer);
}

std::unique_ptr<Work> BackendMemoryGuard::Recv(void* data, size_t count, DataType type, int peer) {
  if (absl::Status s = CheckPair("recv", data, count, type, peer); !s.ok()) {
    return FinishedWork(s);
  }
  return inner_.Recv(data, count, type, peer);
}

}  // namespace dtrain
