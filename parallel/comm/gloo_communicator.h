// The Gloo backend of Communicator: host buffers of every DataType over Gloo's TCP transport. One
// Gloo context per communicator, connected through the rendezvous Store under the group's key
// prefix; the collectives are rings over Gloo's unbound buffers, pipelined in segments (at
// most 1 MiB, and at least two per chunk of 32 KiB or more), so that the bytes counted in stats()
// are exactly the bytes sent.
//
// Failure: every wait inside an operation is bounded by the per-operation timeout. Before a
// collective each rank records the sequence number of the collective it is starting
// (CollectiveProgress, under "<key_prefix>started/<rank>"); a failed or timed-out rank reads
// those records and names the ranks that never started the operation, in its message and as the
// status payload of faulty_ranks.h. A point-to-point operation completes in Work::Wait,
// within the timeout from when it was posted; a failed one blames its peer in that payload,
// counts nothing in stats(), and fails the communicator like a failed collective.
// A peer that dies is an error of the operations that need it: Create makes the process ignore
// SIGPIPE, which Gloo's writes to a dead peer's socket would otherwise raise.
// Thread-safety: as Communicator; Create and the destructor must not race with other calls.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/comm/collective_progress.h"
#include "parallel/comm/communicator.h"
#include "parallel/store/store.h"

namespace gloo {
class Context;
}

namespace dtrain {

struct GlooCommunicatorOptions {
  // The group's name in messages ("world", "dp", ...).
  std::string name = "world";
  // The store namespace of this group: equal on its members, distinct for every group and
  // every re-creation of a group (e.g. "comm/dp.1/").
  std::string key_prefix = "comm/world/";
  int rank = 0;
  int size = 1;
  // world_ranks[i] is the world rank of group rank i, for messages; empty = the identity.
  std::vector<int> world_ranks;
  // The address peers reach this rank's Gloo device at (the node's address on the training
  // network; loopback for single-node tests).
  std::string hostname = "127.0.0.1";
  // Bounds the rendezvous and each operation from the moment it starts running.
  absl::Duration timeout = absl::Seconds(300);
};

class GlooCommunicator : public Communicator {
 public:
  // Connects to every other member (blocking, up to options.timeout). `store` is shared with
  // the caller and must outlive nothing: the communicator keeps it alive.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      std::shared_ptr<Store> store, const GlooCommunicatorOptions& options);

  // Runs the operations already issued, then closes the connections. Peers still waiting on
  // this rank then fail.
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

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

  struct WorkState;   // one operation's outcome, shared by its Work and the worker thread
  struct ElementOps;  // a data type's size and arithmetic, for the ring
  // Point-to-point operations complete in Work::Wait, on the caller's thread: their totals and
  // the first failure, shared with the Works (which may outlive the communicator).
  struct PointToPointLedger;

 private:
  // What runs on the worker thread: the operation's body. Collective bodies return the status
  // to report; a point-to-point body only posts its transfer (Work::Wait completes it).
  using Task = std::function<absl::Status(WorkState&)>;

  GlooCommunicator(std::shared_ptr<Store> store, GlooCommunicatorOptions options,
                   std::shared_ptr<gloo::Context> context);

  std::unique_ptr<Work> Enqueue(Task task);
  // Wraps a collective body: sequence number, progress record, deadline, exception to Status,
  // failure diagnosis and stats (added to stats_.*stats_field unless it is null).
  std::unique_ptr<Work> EnqueueCollective(const char* op_name, OpStats CommStats::*stats_field,
                                          std::function<void(absl::Time, OpStats&)> body);
  std::unique_ptr<Work> EnqueuePointToPoint(bool is_send, void* data, size_t bytes, int peer);
  // Whether an operation failed (worker thread only): a collective, or a point-to-point
  // operation whose Wait failed, which it takes over as broken_.
  bool Broken();
  // FailedPrecondition for `operation` after the communicator failed, blaming the same ranks.
  absl::Status FailedEarlier(const std::string& operation) const;

  // The ring algorithms (worker thread only). Chunk c of the buffers spans
  // [offsets[c], offsets[c + 1]) elements.
  void RingReduceScatter(const std::byte* input, std::byte* in_place, std::byte* output,
                         const ElementOps& ops, const std::vector<size_t>& offsets,
                         absl::Time deadline, OpStats& delta);
  void RingAllGather(std::byte* data, size_t element_bytes, const std::vector<size_t>& offsets,
                     absl::Time deadline, OpStats& delta);
  void ChainBroadcast(std::byte* data, size_t count, size_t element_bytes, int root,
                      absl::Time deadline, OpStats& delta);

  int WorldRank(int group_rank) const { return progress_.WorldRank(group_rank); }

  void WorkerLoop();

  const GlooCommunicatorOptions options_;
  const std::shared_ptr<Store> store_;
  const std::shared_ptr<gloo::Context> context_;
  const std::shared_ptr<PointToPointLedger> ledger_;

  // Worker-thread state: the receive scratch (kScratchSegments x 1 MiB; operator new aligns it
  // for every DataType), the collective sequence number and the first failure, after which
  // every operation fails fast.
  std::vector<std::byte> scratch_;
  int64_t collective_seq_ = 0;
  absl::Status broken_;

  CollectiveProgress progress_;  // the collectives started, for the peers' diagnoses

  mutable std::mutex mu_;
  std::condition_variable queue_changed_;  // worker: an operation was issued, or stopping_
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  CommStats stats_;

  std::thread worker_;
};

}  // namespace dtrain
