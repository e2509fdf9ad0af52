#include "parallel/tensor_parallel.h"

namespace dtrain {

CommTensorParallel::CommTensorParallel(Communicator& tp, Communicator* kv_replicas)
    : tp_(tp), kv_replicas_(kv_replicas) {}

void CommTensorParallel::ReduceForward(float* x, size_t n) {
  ReduceOver(&tp_, x, n, ReduceOp::kSum);
}

void CommTensorParallel::ReduceBackward(float* dx, size_t n) {
  ReduceOver(&tp_, dx, n, ReduceOp::kSum);
}

void CommTensorParallel::ReduceKvReplicas(float* dx, size_t n) {
  if (kv_replicas_ == nullptr && error_.ok()) {
    error_ = absl::FailedPreconditionError(
        "the model replicates kv heads (parallel.tp > model.n_kv_head) but the tensor-parallel "
        "hooks were built without the kv replica group");
  }
  ReduceOver(kv_replicas_, dx, n, ReduceOp::kSum);
}

void CommTensorParallel::GatherRows(const float* own, float* gathered, size_t count) {
  if (!error_.ok()) return;
  error_ = tp_.AllGather(own, gathered, count)->Wait();
}

void CommTensorParallel::ScatterRows(const float* partial, float* own, size_t count) {
  if (!error_.ok()) return;
  error_ = tp_.ReduceScatter(partial, own, count, ReduceOp::kSum)->Wait();
}

void CommTensorParallel::SumRowGradients(float* grad, size_t n) {
  ReduceOver(&tp_, grad, n, ReduceOp::kSum);
}

void CommTensorParallel::VocabMax(float* x, size_t n) { ReduceOver(&tp_, x, n, ReduceOp::kMax); }

void CommTensorParallel::VocabSum(float* x, size_t n) { ReduceOver(&tp_, x, n, ReduceOp::kSum); }

void CommTensorParallel::ReduceOver(Communicator* comm, float* x, size_t n, ReduceOp op) {
  if (!error_.ok()) return;
  error_ = comm->AllReduce(x, n, op)->Wait();
}

}  // namespace dtrain
