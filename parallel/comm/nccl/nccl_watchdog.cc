#include "parallel/comm/nccl/nccl_watchdog.h"

#include <utility>

#include "absl/time/clock.h"

namespace dtrain {

NcclOperation::~NcclOperation() {
  if (event != nullptr) cudaEventDestroy(event);
}

void NcclAbort::Abort() {
  std::lock_guard lock(mu_);
  if (aborted_) return;
  ncclCommAbort(comm_);
  aborted_ = true;
}

NcclWatchdog::NcclWatchdog(int device, std::shared_ptr<NcclAbort> abort, absl::Duration interval)
    : device_(device), abort_(std::move(abort)), interval_(interval) {}

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
      const cudaError_t query = cudaEventQuery(operation->event);
      if (query == cudaErrorNotReady && absl::Now() <= operation->deadline) return false;
      if (query == cudaErrorNotReady) {
        operation->timed_out = true;
        abort_->Abort();
      }
      return true;
    });
  }
}

}  // namespace dtrain
