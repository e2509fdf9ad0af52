// What keeps a device that waits on NCCL from waiting forever (Work::WaitOnDevice): a thread that
// polls the operations a compute stream waits for and aborts the group's communicators when one
// outlives its deadline, as PyTorch's NCCL watchdog does. The abort ends their kernels, and
// with them the stream's wait; the operation's Work then reports the timeout. And what times
// those waits: the exposed communication no host wait sees.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace dtrain {

// A cudaEventQuery's or cudaStreamQuery's result, clearing "not ready" (work still running, no
// error) from the thread's last error, where the runtime records it and the next kernel launch
// would take it for its own failure (as PyTorch's stream and event queries clear it).
cudaError_t Polled(cudaError_t query);

// One issued operation: the event recorded after it, which this owns, and the time it must have
// finished by.
struct NcclOperation {
  NcclOperation(cudaEvent_t event, absl::Time deadline) : event(event), deadline(deadline) {}
  ~NcclOperation();
  NcclOperation(const NcclOperation&) = delete;
  NcclOperation& operator=(const NcclOperation&) = delete;

  cudaEvent_t event;
  absl::Time deadline;
  std::atomic<bool> timed_out{false};  // the watchdog aborted the communicator for it
};

// A communicator's NCCL communicators (the group's, and its point-to-point pairs'), used under
// one lock, since NCCL's calls on a communicator are not thread-safe, and aborted all at once
// by whichever thread needs it first (a Work's Wait or the watchdog). Each index stays valid;
// once an abort began, or after Destroy, Use runs nothing.
class NcclComms {
 public:
  // Adds `comm` (before any operation on it) and returns its index.
  size_t Add(ncclComm_t comm);
  // Runs `call` on communicator `index` unless they were aborted or destroyed; ncclInvalidUsage
  // if they were.
  ncclResult_t Use(size_t index, const std::function<ncclResult_t(ncclComm_t)>& call);
  // ncclCommAbort of each, once, unless destroyed: their kernels end as if done. It waits up to
  // a second for a call in progress, then aborts under it: a call stuck inside NCCL (a full
  // work queue behind a dead peer) waits for an abort to end it.
  void Abort();
  // ncclCommDestroy of each, unless aborted: the owner's last call, once their work finished.
  void Destroy();
  bool aborted() const { return aborted_; }

 private:
  std::timed_mutex mu_;
  std::vector<ncclComm_t> comms_;
  std::atomic<bool> aborted_{false};  // an abort began
  std::atomic<bool> destroyed_{false};
};

// The time compute streams spent in their device waits, each bracketed by two timing events.
// Thread-safe.
class NcclWaitTimer {
 public:
  ~NcclWaitTimer();
  // Makes `stream` wait for `event` between two timing events (0 when the operation finished
  // before the stream got there). The CUDA error, if a call failed.
  cudaError_t Wait(cudaStream_t stream, cudaEvent_t event);
  // Milliseconds of the waits the streams have passed since the last call; later ones count at
  // a later call.
  double TakeMs();

 private:
  std::mutex mu_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> waits_;  // (begin, end)
};

class NcclWatchdog {
 public:
  // Polls on GPU `device` (the communicator's) every `interval`, aborting through `comms`.
  NcclWatchdog(int device, std::shared_ptr<NcclComms> comms,
               absl::Duration interval = absl::Milliseconds(10));
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Watches `operation` until its event completes (or fails: its Wait reports that) or its
  // deadline passes, when it marks it timed out and aborts. Starts the thread on the first call.
  void Watch(std::shared_ptr<NcclOperation> operation);

 private:
  void Run();

  const int device_;
  const std::shared_ptr<NcclComms> comms_;
  const absl::Duration interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::vector<std::shared_ptr<NcclOperation>> watched_;
  std::thread thread_;
};

}  // namespace dtrain
