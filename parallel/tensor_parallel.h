// The tensor-parallel hooks of the model over communicators: the tensor-parallel group's for
// the f and g all-reduces (all-gathers and reduce-scatters under sequence parallelism), and, when
// grouped-query attention replicates kv heads (tp > n_kv_head), the group of ranks holding the same
// kv head: tp ranks [g k, (g + 1) k) for k = LocalDims::kv_replicas and g = tp_rank / k.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "core/model/tensor_parallel.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

class CommTensorParallel final : public TensorParallelOps {
 public:
  // `kv_replicas` is null when no kv head is replicated. Both must outlive this.
  CommTensorParallel(Communicator& tp, Communicator* kv_replicas);

  void ReduceForward(Values x, size_t n) override;
  void ReduceBackward(Values dx, size_t n) override;
  void ReduceKvReplicas(float* dx, size_t n) override;
  void GatherRows(ConstValues own, Values gathered, size_t count) override;
  void ScatterRows(ConstValues partial, Values own, size_t count) override;
  void SumRowGradients(float* grad, size_t n) override;
  void VocabMax(float* x, size_t n) override;
  void VocabSum(float* x, size_t n) override;

  // Each hook's collective makes the compute stream wait for it on the device
  // (Work::WaitOnDevice), so the host goes on issuing kernels (on the CPU, or without a compute
  // stream, the hook waits itself). Settle waits on the host for the collectives issued so far
  // and returns the first failure (OK when none). After a failure the hooks do nothing, so the
  // step runs to its end on garbage and the caller reports this instead of its result.
  absl::Status Settle();
  // Milliseconds the hooks' collectives held up compute since the last call: the host's waits
  // where a hook waits itself, the compute stream's waits (timed with events, counted by Settle)
  // where it waits on the device. The step log's exposed communication.
  double TakeWaitedMs();

 private:
  void ReduceOver(Communicator* comm, Values x, size_t n, ReduceOp op);
  // Orders the compute stream after `work` and keeps it for Settle.
  void Track(std::unique_ptr<Work> work);

  Communicator& tp_;
  Communicator* kv_replicas_;
  absl::Status error_;
  std::vector<std::unique_ptr<Work>> in_flight_;  // since the last Settle
  double waited_ms_ = 0;                          // since the last TakeWaitedMs
};

}  // namespace dtrain
