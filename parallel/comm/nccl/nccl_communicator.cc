#include "parallel/comm/nccl/nccl_communicator.h"

#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/util/exit_codes.h"
#include "core/util/status.h"
#include "parallel/comm/faulty_ranks.h"

namespace dtrain {
namespace {

// How often Wait looks at its event; short against a collective, long against a spin.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// What a failed operation blames: for collective number `seq` (> 0) the peers `progress` finds
// never started it; for a point-to-point operation with `peer_world_rank` (>= 0) that peer.
struct Blame {
  std::shared_ptr<CollectiveProgress> progress;
  int64_t seq = 0;
  int peer_world_rank = -1;
};

class NcclWork : public Work {
 public:
  NcclWork(absl::Status status, std::shared_ptr<NcclOperation> operation,
           std::shared_ptr<NcclComms> comms, size_t link, std::shared_ptr<NcclWatchdog> watchdog,
           std::shared_ptr<NcclWaitTimer> timer, cudaStream_t compute_stream,
           std::string description, absl::Duration timeout, Blame blame)
      : status_(std::move(status)),
        operation_(std::move(operation)),
        comms_(std::move(comms)),
        link_(link),
        watchdog_(std::move(watchdog)),
        timer_(std::move(timer)),
        compute_stream_(compute_stream),
        description_(std::move(description)),
        timeout_(timeout),
        blame_(std::move(blame)) {}
  ~NcclWork() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    if (done_ || !status_.ok()) return status_;
    for (;;) {
      const cudaError_t query = Polled(cudaEventQuery(operation_->event));
      if (operation_->timed_out || (query != cudaSuccess && absl::Now() > operation_->deadline)) {
        comms_->Abort();  // unblocks the streams; the communicators are unusable after
        Fail(absl::DeadlineExceededError(absl::StrCat(description_, " did not finish within ",
                                                      absl::FormatDuration(timeout_))),
             /*timed_out=*/true);
        break;
      }
      // An abort (for another operation) ends the kernels as if they had finished: their
      // buffers hold whatever they had reached. That operation's error blames whom it must.
      if (query == cudaSuccess && comms_->aborted()) {
        status_ = absl::UnavailableError(absl::StrCat(
            description_,
            " has no result to trust: the group's communicators were aborted after another of "
            "its operations failed or timed out, which ends the kernels as if done"));
        break;
      }
      if (query == cudaSuccess) break;
      ncclResult_t async_error = ncclSuccess;
      comms_->Use(link_,
                  [&](ncclComm_t comm) { return ncclCommGetAsyncError(comm, &async_error); });
      if (query != cudaErrorNotReady && async_error == ncclSuccess) {
        // A sticky error of this GPU (a kernel of this rank that faulted): no peer's doing.
        comms_->Abort();
        status_ = absl::InternalError(absl::StrCat(
            description_, " cannot finish: this rank's GPU failed (", cudaGetErrorString(query),
            "), an error of its own kernels or copies, not of a peer"));
        break;
      }
      if (async_error != ncclSuccess) {
        comms_->Abort();  // NCCL's kernels would otherwise spin on
        Fail(absl::UnavailableError(
                 absl::StrCat(description_, " failed: ", ncclGetErrorString(async_error))),
             /*timed_out=*/false);
        break;
      }
      absl::SleepFor(kPollInterval);
    }
    done_ = true;
    return status_;
  }

  absl::Status WaitOnDevice() override {
    if (done_ || !status_.ok() || compute_stream_ == nullptr) return Wait();
    // A device wait that could not be set up is a host wait: the operation still runs, and the
    // buffers it reads and writes must not be reused before it ends.
    if (timer_->Wait(compute_stream_, operation_->event) != cudaSuccess) return Wait();
    watchdog_->Watch(operation_);
    return absl::OkStatus();
  }

 private:
  // status_ becomes `failure`, saying which peers held it up and blaming them (faulty_ranks.h),
  // as the Gloo communicator's do.
  void Fail(const absl::Status& failure, bool timed_out) {
    std::vector<int> blamed;
    std::string why;
    if (blame_.seq > 0) {
      why = blame_.progress->Diagnose(blame_.seq, timed_out, blamed);
    } else if (blame_.peer_world_rank >= 0) {
      blamed.push_back(blame_.peer_world_rank);
      why = absl::StrCat("rank ", blame_.peer_world_rank,
                         timed_out ? " never completed its side (exited, crashed, hung, or "
                                     "issued other operations)"
                                   : " failed its side (exited, crashed, or lost the connection)");
    } else {
      why = "a peer never issued it, exited, or issues different collectives";
    }
    status_ = absl::Status(failure.code(), absl::StrCat(failure.message(), ": ", why));
    SetFaultyRanks(status_, blamed);
  }

  absl::Status status_;
  std::shared_ptr<NcclOperation> operation_;
  std::shared_ptr<NcclComms> comms_;
  size_t link_;  // the communicator it runs on, in comms_
  // Shared with the communicator, which a Work may outlive (a failure unwinding).
  std::shared_ptr<NcclWatchdog> watchdog_;
  std::shared_ptr<NcclWaitTimer> timer_;
  cudaStream_t compute_stream_;
  std::string description_;
  absl::Duration timeout_;
  Blame blame_;
  bool done_ = false;
};

// `waiting` waits on the device for the work already issued on `on`; the CUDA error where a
// call failed.
cudaError_t StreamWaits(cudaStream_t waiting, cudaStream_t on) {
  cudaEvent_t event = nullptr;
  cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (error != cudaSuccess) return error;
  error = cudaEventRecord(event, on);
  if (error == cudaSuccess) error = cudaStreamWaitEvent(waiting, event, 0);
  cudaEventDestroy(event);  // released once the wait is satisfied
  return error;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

ncclDataType_t NcclType(DataType type) {
  switch (type) {
    case DataType::kF32:
      return ncclFloat32;
    case DataType::kBF16:
      return ncclBfloat16;
    case DataType::kF64:
      return ncclFloat64;
    case DataType::kI64:
      return ncclInt64;
    case DataType::kU64:
      return ncclUint64;
  }
  return ncclFloat32;
}

// Whether the work issued on `stream` so far finishes by `deadline` (polled).
bool FinishesBy(cudaStream_t stream, absl::Time deadline) {
  while (Polled(cudaStreamQuery(stream)) == cudaErrorNotReady) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(kPollInterval);
  }
  return true;
}

// The id of an NCCL communicator of `size` members under store keys `prefix`* (`what` names it
// in messages), which member 0 creates and the others read, once every member has arrived:
// ncclCommInitRank waits for every member without a timeout, so a member that never comes fails
// the others here, after `timeout`, counted.
absl::StatusOr<ncclUniqueId> MeetForId(Store& store, const std::string& prefix, int member,
                                       int size, absl::Duration timeout, absl::string_view what) {
  ncclUniqueId id;
  if (member == 0) {
    if (ncclResult_t result = ncclGetUniqueId(&id); result != ncclSuccess) {
      return absl::UnavailableError(
          absl::StrCat(what, ": ncclGetUniqueId: ", ncclGetErrorString(result)));
    }
    RETURN_IF_ERROR(store.Set(prefix + "id", std::string_view(id.internal, sizeof(id.internal))));
  } else {
    ASSIGN_OR_RETURN(const std::string bytes, store.Get(prefix + "id", timeout));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(
          absl::StrFormat("store key '%sid' holds %d bytes, not an NCCL id", prefix, bytes.size()));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  ASSIGN_OR_RETURN(const int64_t joined, store.Add(prefix + "joined", 1));
  if (joined == size) RETURN_IF_ERROR(store.Set(prefix + "ready", "1"));
  if (absl::Status ready = store.Wait({prefix + "ready"}, timeout); !ready.ok()) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s: %d of %d ranks joined within %s (the others never reached their NCCL setup: see "
        "their logs): %s",
        what, store.Add(prefix + "joined", 0).value_or(joined), size, absl::FormatDuration(timeout),
        ready.message()));
  }
  return id;
}

// Without stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported 0: some virtualised
// GPUs), the backend frees with cudaFree, which waits for every stream of the GPU: a pipeline
// stage freeing a buffer while its own receive is posted would wait for a send that comes only
// after its next output. One GPU alone trains there; NCCL groups are refused.
absl::Status CheckMemoryPools(const std::string& what) {
  int device = 0, pools = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
  if (e != cudaSuccess) return CudaStatus(e, "cudaDeviceGetAttribute");
  if (pools != 0) return absl::OkStatus();
  // Exit 2: a restart meets the same GPU.
  return WithExitCode(
      absl::FailedPreconditionError(absl::StrFormat(
          "%s: GPU %d has no stream-ordered memory pool (cudaDevAttrMemoryPoolsSupported is 0, as "
          "on "
          "some virtualised GPUs), which dtrain's NCCL groups need so that freeing a buffer never "
          "waits for the whole GPU; train on one such GPU alone, or on GPUs whose driver has "
          "memory "
          "pools",
          what, device)),
      kExitUsage);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Store> store, const NcclCommunicatorOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("communicator '%s': rank %d is outside a group of size %d", options.name,
                        options.rank, options.size));
  }
  const std::string what = absl::StrCat("communicator '", options.name, "'");
  RETURN_IF_ERROR(CheckMemoryPools(what));
  ASSIGN_OR_RETURN(const ncclUniqueId id,
                   MeetForId(*store, options.key_prefix + "nccl_", options.rank, options.size,
                             options.timeout, what));
  ncclComm_t comm = nullptr;
  if (ncclResult_t result = ncclCommInitRank(&comm, options.size, id, options.rank);
      result != ncclSuccess) {
    return absl::UnavailableError(absl::StrFormat(
        "communicator '%s': rank %d of %d: ncclCommInitRank: %s (NCCL_DEBUG=INFO says more)",
        options.name, options.rank, options.size, ncclGetErrorString(result)));
  }
  cudaStream_t stream = nullptr;
  float* scalar = nullptr;
  int device = 0;
  absl::Status status = CudaStatus(cudaGetDevice(&device), "cudaGetDevice");
  if (status.ok()) {
    status =
        CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  // Stream-ordered, as the destructor frees it: cudaFree would wait for the whole device.
  if (status.ok()) {
    status = CudaStatus(cudaMallocAsync(&scalar, sizeof(float), stream), "cudaMallocAsync");
  }
  if (status.ok()) {
    status = CudaStatus(cudaMemsetAsync(scalar, 0, sizeof(float), stream), "cudaMemsetAsync");
  }
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (!status.ok()) {
    if (scalar != nullptr) cudaFreeAsync(scalar, stream);
    if (stream != nullptr) cudaStreamDestroy(stream);
    ncclCommDestroy(comm);
    return status;
  }
  std::unique_ptr<NcclCommunicator> created(
      new NcclCommunicator(store, options, comm, device, stream, scalar));
  if (options.point_to_point) {
    if (absl::Status connected = created->ConnectPairs(*store); !connected.ok()) {
      created->comms_->Abort();  // no kernel of a half-made pair may hold the destructor
      return connected;
    }
  }
  return created;
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Store> store, NcclCommunicatorOptions options,
                                   ncclComm_t comm, int device, cudaStream_t stream,
                                   float* barrier_scalar)
    : options_(std::move(options)),
      // Under its own keys: a Gloo communicator of the same prefix numbers its collectives apart.
      progress_(std::make_shared<CollectiveProgress>(std::move(store),
                                                     options_.key_prefix + "nccl_", options_.rank,
                                                     options_.size, options_.world_ranks)),
      comms_(std::make_shared<NcclComms>()),
      watchdog_(std::make_shared<NcclWatchdog>(device, comms_)),
      wait_timer_(std::make_shared<NcclWaitTimer>()),
      streams_{stream},
      stream_(stream),
      barrier_scalar_(barrier_scalar) {
  comms_->Add(comm);
}

absl::Status NcclCommunicator::ConnectPairs(Store& store) {
  const int n = options_.size, me = options_.rank;
  send_links_.assign(n, 0);
  recv_links_.assign(n, 0);
  // Every member takes the pairs in the same order, each a meeting of its two members only:
  // the first pair not yet connected finds both of its members at it.
  for (int from = 0; from < n; ++from) {
    std::vector<int> neighbours = {(from + n - 1) % n};  // of 2, the one is both
    if (n > 2) neighbours.push_back((from + 1) % n);
    for (const int to : neighbours) {
      if (from == to || (from != me && to != me)) continue;
      const std::string what =
          absl::StrFormat("communicator '%s', the point-to-point pair from rank %d to rank %d",
                          options_.name, WorldRank(from), WorldRank(to));
      ASSIGN_OR_RETURN(
          const ncclUniqueId id,
          MeetForId(store, absl::StrCat(options_.key_prefix, "nccl_pair/", from, "-", to, "/"),
                    from == me ? 0 : 1, 2, options_.timeout, what));
      cudaStream_t stream = nullptr;
      RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                 "cudaStreamCreate"));
      streams_.push_back(stream);
      ncclComm_t pair = nullptr;
      if (ncclResult_t result = ncclCommInitRank(&pair, 2, id, from == me ? 0 : 1);
          result != ncclSuccess) {
        return absl::UnavailableError(
            absl::StrCat(what, ": ncclCommInitRank: ", ncclGetErrorString(result),
                         " (NCCL_DEBUG=INFO says more)"));
      }
      const size_t link = comms_->Add(pair);
      (from == me ? send_links_[to] : recv_links_[from]) = link;
      // NCCL connects a pair's channels at its first Send and Recv, the two hosts meeting inside
      // those calls: one value crosses here, where both members are, so that no later Send or
      // Recv (the pipeline posts its receives early) holds its host for the peer.
      const ncclResult_t first = comms_->Use(link, [&](ncclComm_t comm) {
        return from == me ? ncclSend(barrier_scalar_, 1, ncclFloat32, 1, comm, stream)
                          : ncclRecv(barrier_scalar_, 1, ncclFloat32, 0, comm, stream);
      });
      if (first != ncclSuccess) {
        return absl::UnavailableError(
            absl::StrCat(what, ": connecting it: ", ncclGetErrorString(first)));
      }
      if (!FinishesBy(stream, absl::Now() + options_.timeout)) {
        return absl::DeadlineExceededError(absl::StrCat(
            what, ": its first value did not cross within ", absl::FormatDuration(options_.timeout),
            " (the peer died or hung meanwhile)"));
      }
    }
  }
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  // A kernel nobody waited for (a failure unwinding) may never end: the group is aborted then.
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (cudaStream_t stream : streams_) {
    if (!FinishesBy(stream, deadline)) comms_->Abort();
    cudaStreamSynchronize(stream);
  }
  // After every stream's work: the pairs' warm-up values crossed in it.
  cudaFreeAsync(barrier_scalar_, stream_);
  comms_->Destroy();
  for (cudaStream_t stream : streams_) cudaStreamDestroy(stream);
}

int NcclCommunicator::WorldRank(int group_rank) const {
  // A peer outside the group (NCCL refuses it) is named as given.
  if (options_.world_ranks.empty() || group_rank < 0 || group_rank >= options_.size) {
    return group_rank;
  }
  return options_.world_ranks[group_rank];
}

std::unique_ptr<Work> NcclCommunicator::Finish(absl::string_view op_name, ncclResult_t enqueued,
                                               size_t link, int peer) {
  std::string description = absl::StrFormat("%s on group '%s' (%d ranks) at rank %d", op_name,
                                            options_.name, options_.size, WorldRank(options_.rank));
  absl::Status status;
  cudaEvent_t event = nullptr;
  if (comms_->aborted()) {
    status = absl::FailedPreconditionError(
        absl::StrCat(description,
                     ": the group's communicators were aborted after an operation failed or "
                     "timed out"));
    // Enqueued before the abort, the operation's kernel ends with it; its buffers are free once
    // the stream passes it.
    if (enqueued == ncclSuccess) cudaStreamSynchronize(streams_[link]);
  } else if (enqueued != ncclSuccess) {
    status = absl::UnavailableError(
        absl::StrCat(description, " failed to start: ", ncclGetErrorString(enqueued)));
  } else if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
             e != cudaSuccess || (e = cudaEventRecord(event, streams_[link])) != cudaSuccess) {
    status = CudaStatus(e, "cudaEventRecord");
    // The operation runs all the same: its Work, which has no event to wait for, reports the
    // error only once the operation's buffers are free again.
    if (!FinishesBy(streams_[link], absl::Now() + options_.timeout)) comms_->Abort();
    cudaStreamSynchronize(streams_[link]);
  }
  Blame blame{.progress = progress_};
  if (peer >= 0) {
    blame.peer_world_rank = WorldRank(peer);
  } else if (status.ok()) {
    blame.seq = ++collective_seq_;
    progress_->Started(blame.seq);
  }
  return std::make_unique<NcclWork>(
      std::move(status), std::make_shared<NcclOperation>(event, absl::Now() + options_.timeout),
      comms_, link, watchdog_, wait_timer_, options_.compute_stream, std::move(description),
      options_.timeout, std::move(blame));
}

void NcclCommunicator::Count(OpStats CommStats::*field, int64_t sent, int64_t received) {
  std::lock_guard lock(mu_);
  OpStats& stats = stats_.*field;
  stats.calls += 1;
  stats.bytes_sent += sent;
  stats.bytes_received += received;
}

std::unique_ptr<Work> NcclCommunicator::Issue(
    absl::string_view op_name, size_t link, int peer,
    const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call) {
  cudaStream_t stream = streams_[link];
  if (options_.compute_stream != nullptr) {
    if (const cudaError_t error = StreamWaits(stream, options_.compute_stream);
        error != cudaSuccess) {
      // Issued unordered, it would read buffers the compute stream's kernels are still writing.
      return FinishedWork(
          CudaStatus(error, absl::StrCat(op_name, " cannot wait for the compute stream").c_str()));
    }
  }
  return Finish(op_name, comms_->Use(link, [&](ncclComm_t comm) { return call(comm, stream); }),
                link, peer);
}

std::unique_ptr<Work> NcclCommunicator::AllReduce(void* data, size_t count, DataType type,
                                                  ReduceOp op) {
  if (absl::Status valid = CheckReduction(type, op, "all_reduce", options_.name); !valid.ok()) {
    return FinishedWork(std::move(valid));
  }
  const int64_t bytes = static_cast<int64_t>(count) * DataTypeBytes(type);
  const int64_t ring_bytes = 2 * (options_.size - 1) * bytes / options_.size;
  Count(&CommStats::all_reduce, ring_bytes, ring_bytes);
  return Issue("all_reduce", 0, -1, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(data, data, count, NcclType(type), NcclOp(op), comm, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                                      DataType type, ReduceOp op) {
  if (absl::Status valid = CheckReduction(type, op, "reduce_scatter", options_.name); !valid.ok()) {
    return FinishedWork(std::move(valid));
  }
  const int64_t ring_bytes =
      (options_.size - 1) * static_cast<int64_t>(count) * DataTypeBytes(type);
  Count(&CommStats::reduce_scatter, ring_bytes, ring_bytes);
  return Issue("reduce_scatter", 0, -1, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclReduceScatter(input, output, count, NcclType(type), NcclOp(op), comm, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::AllGather(const void* input, void* output, size_t count,
                                                  DataType type) {
  const int64_t ring_bytes =
      (options_.size - 1) * static_cast<int64_t>(count) * DataTypeBytes(type);
  Count(&CommStats::all_gather, ring_bytes, ring_bytes);
  return Issue("all_gather", 0, -1, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllGather(input, output, count, NcclType(type), comm, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::Broadcast(void* data, size_t count, DataType type,
                                                  int root) {
  // NCCL's broadcast is a chain from the root: every rank but the last forwards the buffer.
  const int position = (options_.rank - root + options_.size) % options_.size;
  const int64_t bytes = static_cast<int64_t>(count) * DataTypeBytes(type);
  Count(&CommStats::broadcast, position < options_.size - 1 ? bytes : 0, position > 0 ? bytes : 0);
  return Issue("broadcast", 0, -1, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(data, data, count, NcclType(type), root, comm, stream);
  });
}

// Each runs on its pair's communicator, where the peer is rank 1 (the receiver) of a Send's and
// rank 0 (the sender) of a Recv's.
std::unique_ptr<Work> NcclCommunicator::Send(const void* data, size_t count, DataType type,
                                             int peer) {
  return OnPair(send_links_, peer, absl::StrCat("send to rank ", WorldRank(peer)), &CommStats::send,
                static_cast<int64_t>(count) * DataTypeBytes(type), 0,
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclSend(data, count, NcclType(type), 1, comm, stream);
                });
}

std::unique_ptr<Work> NcclCommunicator::Recv(void* data, size_t count, DataType type, int peer) {
  return OnPair(recv_links_, peer, absl::StrCat("recv from rank ", WorldRank(peer)),
                &CommStats::recv, 0, static_cast<int64_t>(count) * DataTypeBytes(type),
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclRecv(data, count, NcclType(type), 0, comm, stream);
                });
}

std::unique_ptr<Work> NcclCommunicator::OnPair(
    const std::vector<size_t>& links, int peer, const std::string& op_name,
    OpStats CommStats::*field, int64_t sent, int64_t received,
    const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call) {
  if (absl::Status refused = CheckPointToPoint(options_.point_to_point, options_.rank,
                                               options_.size, peer, op_name, options_.name);
      !refused.ok()) {
    return FinishedWork(std::move(refused));
  }
  const size_t link = links[peer];  // ConnectPairs connected every pair the check lets through
  Count(field, sent, received);
  return Issue(op_name, link, peer, call);
}

absl::Status NcclCommunicator::Barrier() {
  return Finish("barrier",
                comms_->Use(0,
                            [&](ncclComm_t comm) {
                              return ncclAllReduce(barrier_scalar_, barrier_scalar_, 1, ncclFloat32,
                                                   ncclSum, comm, stream_);
                            }),
                0)
      ->Wait();
}

double NcclCommunicator::TakeDeviceWaitMs() { return wait_timer_->TakeMs(); }

CommStats NcclCommunicator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace dtrain
