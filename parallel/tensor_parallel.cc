#include "parallel/tensor_parallel.h"

#include <chrono>
#include <utility>

namespace dtrain {

CommTensorParallel::CommTensorParallel(Communicator& tp, Communicator* kv_replicas)
    : tp_(tp), kv_replicas_(kv_replicas) {}

void CommTensorParallel::ReduceForward(Values x, size_t n) {
  ReduceOver(&tp_, x, n, ReduceOp::kSum);
}

void CommTensorParallel::ReduceBackward(Values dx, size_t n) {
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

void CommTensorParallel::GatherRows(ConstValues own, Values gathered, size_t count) {
  if (!error_.ok()) return;
  Track(tp_.AllGather(own.data(), gathered.data(), count, own.dtype()));
}

void CommTensorParallel::ScatterRows(ConstValues partial, Values own, size_t count) {
  if (!error_.ok()) return;
  Track(tp_.ReduceScatter(partial.data(), own.data(), count, partial.dtype(), ReduceOp::kSum));
}

void CommTensorParallel::SumRowGradients(float* grad, size_t n) {
  ReduceOver(&tp_, grad, n, ReduceOp::kSum);
}

void CommTensorParallel::VocabMax(float* x, size_t n) { ReduceOver(&tp_, x, n, ReduceOp::kMax); }

void CommTensorParallel::VocabSum(float* x, size_t n) { ReduceOver(&tp_, x, n, ReduceOp::kSum); }

void CommTensorParallel::ReduceOver(Communicator* comm, Values x, size_t n, ReduceOp op) {
  if (!error_.ok()) return;
  Track(comm->AllReduce(x.data(), n, x.dtype(), op));
}

void CommTensorParallel::Track(std::unique_ptr<Work> work) {
  const auto start = std::chrono::steady_clock::now();
  error_ = work->WaitOnDevice();
  waited_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  in_flight_.push_back(std::move(work));
}

absl::Status CommTensorParallel::Settle() {
  for (std::unique_ptr<Work>& work : in_flight_) {
    if (absl::Status status = work->Wait(); error_.ok()) error_ = status;
  }
  in_flight_.clear();
  // The device's waits on the operations just settled (their timing events are freed here).
  waited_ms_ += tp_.TakeDeviceWaitMs();
  if (kv_replicas_ != nullptr) waited_ms_ += kv_replicas_->TakeDeviceWaitMs();
  return error_;
}

double CommTensorParallel::TakeWaitedMs() { return std::exchange(waited_ms_, 0); }

}  // namespace dtrain
