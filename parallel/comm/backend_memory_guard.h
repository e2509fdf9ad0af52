// A communicator of backend memory: the mesh groups' (tp, dp, pp, kv replicas), whose buffers
// are the model's activations, parameters and gradients. Under CUDA they are NCCL's and the
// buffers are GPU memory, where a host buffer would fault the GPU or be read as garbage; the
// guard checks every operation's buffers with Backend::Holds first and fails the operation
// instead, naming it and the group. On the CPU backend (Gloo, where host memory would work)
// the same check is what lets every CPU run catch the buffer a GPU run would fault on. Host
// values cross such a group through backend memory (host_values.h). It holds Send and Recv to
// the pairs NCCL connects (CheckPointToPoint) the same way.
#pragma once

#include <memory>
#include <string>

#include "core/backend/backend.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

class BackendMemoryGuard : public Communicator {
 public:
  // Checks `inner`'s buffers against `backend`, and its Sends and Recvs against
  // `point_to_point` (GroupSpec's); owns `inner`.
  BackendMemoryGuard(std::unique_ptr<Communicator> inner, const Backend& backend,
                     bool point_to_point);
  // The same over a communicator that stays the caller's and must outlive the guard (the world's,
  // serving a group of every rank on the CPU), as the group `name`.
  BackendMemoryGuard(Communicator& inner, std::string name, const Backend& backend,
                     bool point_to_point);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return name_; }

  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Broadcast;
  using Communicator::Recv;
  using Communicator::ReduceScatter;
  using Communicator::Send;
  std::unique_ptr<Work> AllReduce(void* data, size_t count, DataType type, ReduceOp op) override;
  std::unique_ptr<Work> ReduceScatter(const void* input, void* output, size_t count, DataType type,
                                      ReduceOp op) override;
  std::unique_ptr<Work> AllGather(const void* input, void* output, size_t count,
                                  DataType type) override;
  std::unique_ptr<Work> Broadcast(void* data, size_t count, DataType type, int root) override;
  std::unique_ptr<Work> Send(const void* data, size_t count, DataType type, int peer) override;
  std::unique_ptr<Work> Recv(void* data, size_t count, DataType type, int peer) override;
  absl::Status Barrier() override { return inner_.Barrier(); }
  CommStats stats() const override { return inner_.stats(); }
  const Communicator& counted() const override { return inner_.counted(); }
  double TakeDeviceWaitMs() override { return inner_.TakeDeviceWaitMs(); }

 private:
  // OK when `count` elements of `type` at `data` are the backend's memory; else an Internal
  // error naming the operation, the buffer (`role`) and the group.
  absl::Status Check(const char* op_name, const char* role, const void* data, size_t count,
                     DataType type) const;
  // Check's, and CheckPointToPoint's for `peer`.
  absl::Status CheckPair(const char* op_name, const void* data, size_t count, DataType type,
                         int peer) const;

  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
  const std::string name_;
  const Backend& backend_;
  const bool point_to_point_;
};

}  // namespace dtrain
