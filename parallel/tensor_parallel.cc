#include "parallel/tensor_parallel.h"

namespace dtrain {

CommTensorParallel::CommTensorParallel(Communicator& tp, Communicator* kv_replicas)
    : tp_(tp), kv_replicas_(kv_replicas) {}

void CommTensorParallel::ReduceForward(float* x, size_t n) { SumOver(&tp_, x, n); }

void CommTensorParallel::ReduceBackward(float* dx, size_t n) { SumOver(&tp_, dx, n); }

void CommTensorParallel::ReduceKvReplicas(float* dx, size_t n) {
  if (kv_replicas_ == nullptr && error_.ok()) {
    error_ = absl::FailedPreconditionError(
        "the model replicates kv heads (parallel.tp > model.n_kv_head) but the tensor-parallel "
        "hooks were built without the kv replica group");
  }
  SumOver(kv_replicas_, dx, n);
}

void CommTensorParallel::GatherRows(const float* own, float* gathered, size_t count) {
  if (!error_.ok()) return;
  error_ = tp_.AllGather(own, gathered, count)->Wait();
}

void CommTensorParallel::ScatterRows(const float* partial, float* own, size_t count) {
  if (!error_.ok()) return;
  error_ = tp_.ReduceScatter(partial, own, count, ReduceOp::kSum)->Wait();
}

void CommTensorParallel::SumRowGradients(float* grad, size_t n) { SumOver(&tp_, grad, n); }

void CommTensorParallel::SumOver(Communicator* comm, float* x, size_t n) {
  if (!error_.ok()) return;
  error_ = comm->AllReduce(x, n, ReduceOp::kSum)->Wait();
}

}  // namespace dtrain
