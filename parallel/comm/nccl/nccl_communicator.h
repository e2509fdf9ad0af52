// The NCCL backend of Communicator: device buffers of the current CUDA device, every DataType.
// Built only with the CUDA toolkit, into the CUDA module (core/backend/cuda_module.h). Rank 0 of
// the group creates the 128-byte ncclUniqueId and Sets it under "<key_prefix>nccl_id"; the others
// Get it; once all have met in the store (within the timeout), ncclCommInitRank. Each group
// (tp/dp/pp) has its own key prefix and so its own id and communicator.
//
// The communicators are blocking, as PyTorch's are by default. A non-blocking one
// (`ncclConfig_t::blocking = 0`) could be aborted inside ncclCommInitRank or inside a first
// collective's lazy connection, but NCCL then launches every operation from a new host thread
// (src/group.cc, NCCL 2.28) and returns before the kernel is on the stream, so each would cost a
// thread and a poll before its event could be recorded, on a path the tp hooks take four times a
// block. A host stuck in such a call because a peer died meanwhile is ended with the job: the
// agent stops every worker when one fails, and the Slurm scripts run srun --kill-on-bad-exit.
//
// Collectives are enqueued in issue order on the communicator's stream. NCCL runs one
// communicator's operations one after another, whatever their streams, and a Send blocks the GPU
// until the peer's Recv runs: two ranks that each Send before they Recv on one communicator would
// wait for each other forever. So a group created for point-to-point use (`point_to_point`, the
// pipeline's) connects each member to its previous and next member on the group's ring, each way
// by a communicator of two with its own stream, on which the sender's Sends meet the receiver's
// Recvs in order; the other groups, and other peers, are refused. Their kernels run beside the
// collectives' and each other's (NCCL asks that of the GPU's resources, as the tp, dp and pp
// groups' communicators already do), ordered only after the compute stream's work: a Send of a
// collective's output waits for that collective first (Wait or WaitOnDevice). A Work records an
// event; Wait polls it and NCCL's async error, and on a timeout or an error aborts all of this
// group's communicators; WaitOnDevice makes the compute stream wait for the event and hands it to
// the watchdog (nccl_watchdog.h), which aborts them when it outlives the timeout while no host
// waits. Every Work of an aborted group fails. A failure names the operation and group, and the
// peers that never started the collective (CollectiveProgress, through the store) or the
// point-to-point peer, whom it blames as the Gloo communicator does. stats() counts
// the bytes NCCL's ring algorithms move (NCCL does not report them). Thread-compatible, like
// Communicator.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "parallel/comm/collective_progress.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/nccl/nccl_watchdog.h"
#include "parallel/store/store.h"

namespace dtrain {

struct NcclCommunicatorOptions {
  std::string name = "world";
  std::string key_prefix = "comm/world/";  // as GlooCommunicatorOptions::key_prefix
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;  // for messages; empty = the identity
  absl::Duration timeout = absl::Seconds(300);
  // The stream the buffers' kernels run on (the CUDA backend's), or null. When set, every
  // operation first waits, on the device, for the work issued on it so far (an event), so that a
  // collective never reads a buffer a kernel is still writing; the host never blocks for it.
  cudaStream_t compute_stream = nullptr;
  // The members Send and Recv to each other: each pair gets its communicators (see above).
  bool point_to_point = false;
};

class NcclCommunicator : public Communicator {
 public:
  // Uses the calling thread's current CUDA device.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      std::shared_ptr<Store> store, const NcclCommunicatorOptions& options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  const std::string& name() const override { return options_.name; }

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
  absl::Status Barrier() override;
  CommStats stats() const override;
  double TakeDeviceWaitMs() override;

  // The stream collectives run on, for callers that order their kernels after them.
  cudaStream_t stream() const { return stream_; }

 private:
  NcclCommunicator(std::shared_ptr<Store> store, NcclCommunicatorOptions options, ncclComm_t comm,
                   int device, cudaStream_t stream, float* barrier_scalar);

  // One communicator of two (the sender is its rank 0) per direction between this rank and each
  // ring neighbour, each with its own stream, created and connected (one value sent) pair by pair
  // in one order on every member, so that no two wait for each other; each step within the
  // timeout.
  absl::Status ConnectPairs(Store& store);
  // A point-to-point operation with group rank `peer` on its pair's communicator (of `links`):
  // counts `sent` and `received` bytes under `field` and issues `call` on the pair's stream; an
  // error Work, naming the operation, if this group has no such pair (not a point-to-point
  // group, or not a neighbour).
  std::unique_ptr<Work> OnPair(const std::vector<size_t>& links, int peer,
                               const std::string& op_name, OpStats CommStats::*field, int64_t sent,
                               int64_t received,
                               const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call);
  int WorldRank(int group_rank) const;
  // Records the enqueue outcome and an event on streams_[link] into a Work. `op_name` names the
  // operation in messages ("all_reduce", "send to rank 3"); `peer` is a point-to-point
  // operation's group rank, -1 for a collective, which takes the next number and is published
  // as started.
  std::unique_ptr<Work> Finish(absl::string_view op_name, ncclResult_t enqueued, size_t link,
                               int peer = -1);
  void Count(OpStats CommStats::*field, int64_t sent, int64_t received);
  // Issues `call` on streams_[link] once that stream waits on the device for the work already
  // on the compute stream (when there is one), and Finishes it; an error Work, without issuing
  // it, where that wait could not be set up.
  std::unique_ptr<Work> Issue(absl::string_view op_name, size_t link, int peer,
                              const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call);

  const NcclCommunicatorOptions options_;
  // The collectives started, for the peers' diagnoses. It, the watchdog and the timer are
  // shared with the Works, which may outlive the communicator.
  std::shared_ptr<CollectiveProgress> progress_;
  int64_t collective_seq_ = 0;
  std::shared_ptr<NcclComms> comms_;  // the group's (0) and the pairs', aborted at most once
  std::shared_ptr<NcclWatchdog> watchdog_;
  std::shared_ptr<NcclWaitTimer> wait_timer_;
  std::vector<cudaStream_t> streams_;  // one per communicator of comms_, by index
  cudaStream_t stream_;                // streams_[0]: the collectives'
  std::vector<size_t> send_links_;  // by peer: the pair communicator this rank sends on (0: none)
  std::vector<size_t> recv_links_;  // by peer: the one it receives on (0: none)
  float* barrier_scalar_;           // (1) device memory for Barrier's all-reduce
  mutable std::mutex mu_;
  CommStats stats_;
};

}  // namespace dtrain
