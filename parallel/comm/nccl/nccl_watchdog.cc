#include "parallel/comm/nccl/nccl_watchdog.h"

#include <chrono>
#include <utility>

#include "absl/time/clock.h"

namespace dtrain {

cudaError_t Polled(cudaError_t query) {
  if (query == cudaErrorNotReady) cudaGetLastError();
  return query;
}

NcclOperation::~NcclOperation() {
  if (event != nullptr) cudaEventDestroy(event);
}

size_t NcclComms::Add(ncclComm_t comm) {
  std::lock_guard lock(mu_);
  comms_.push_back(comm);
  return comms_.size() - 1;
}

ncclResult_t NcclComms::Use(size_t index, const std::function<ncclResult_t(ncclComm_t)>& call) {
  std::lock_guard lock(mu_);
  return aborted_ || destroyed_ ? ncclInvalidUsage : call(comms_[index]);
}

void NcclComms::Abort() {
  if (aborted_.exchange(true)) return;
  std::unique_lock lock(mu_, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::seconds(1));
  if (destroyed_) return;
  for (const ncclComm_t comm : comms_) ncclCommAbort(comm);
}

void NcclComms::Destroy() {
  std::lock_guard lock(mu_);
  if (aborted_ || destroyed_) return;
  destroyed_ = true;
  for (const ncclComm_t comm : comms_) ncclCommDestroy(comm);
}

NcclWaitTimer::~NcclWaitTimer() {
  for (const auto& [begin, end] : waits_) {
    cudaEventDestroy(begin);
    cudaEventDestroy(end);
  }
}

cudaError_t NcclWaitTimer::Wait(cudaStream_t stream, cudaEvent_t event) {
  cudaEvent_t begin = nullptr, end = nullptr;
  cudaError_t e = cudaEventCreate(&begin);
  if (e == cudaSuccess) e = cudaEventCreate(&end);
  if (e == cudaSuccess) e = cudaEventRecord(begin, stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, event, 0);
  if (e == cudaSuccess) e = cudaEventRecord(end, stream);
  if (e != cudaSuccess) {
    if (begin != nullptr) cudaEventDestroy(begin);
    if (end != nullptr) cudaEventDestroy(end);
    return e;
  }
  std::lock_guard lock(mu_);
  waits_.emplace_back(begin, end);
  return cudaSuccess;
}

double NcclWaitTimer::TakeMs() {
  std::lock_guard lock(mu_);
  double total = 0;
  std::erase_if(waits_, [&](const std::pair<cudaEvent_t, cudaEvent_t>& wait) {
    if (Polled(cudaEventQuery(wait.second)) != cudaSuccess) return false;  // not passed yet
    float ms = 0;
    if (cudaEventElapsedTime(&ms, wait.first, wait.second) == cudaSuccess) total += ms;
    cudaEventDestroy(wait.first);
    cudaEventDestroy(wait.second);
    return true;
  });
  return total;
}

NcclWatchdog::NcclWatchdog(int device, std::shared_ptr<NcclComms> comms, absl::Duration interval)
    : device_(device), comms_(std::move(comms)), interval_(interval) {}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NcclWatchdog::Watch(std::shared_ptr<NcclOperation> operation) {
  std::lock_guard lock(mu_);
  watched_.push_back(std::move(operation));
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void NcclWatchdog::Run() {
  cudaSetDevice(device_);
  std::unique_lock lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, absl::ToChronoMilliseconds(interval_));
    std::erase_if(watched_, [&](const std::shared_ptr<NcclOperation>& operation) {
      const cudaError_t query = Polled(cudaEventQuery(operation->event));
      if (query == cudaErrorNotReady && absl::Now() <= operation->deadline) return false;
      if (query == cudaErrorNotReady) {
        operation->timed_out = true;
        comms_->Abort();
      }
      return true;
    });
  }
}

}  // namespace dtrain
