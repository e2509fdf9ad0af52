#include "parallel/comm/nccl/nccl_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
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
// never started it; for a point-to-point operation with `peer_world_rank` (>= 0) that peer, when
// it timed out.
struct Blame {
  CollectiveProgress* progress = nullptr;
  int64_t seq = 0;
  int peer_world_rank = -1;
};

class NcclWork : public Work {
 public:
  NcclWork(absl::Status status, std::shared_ptr<NcclOperation> operation,
           std::shared_ptr<NcclAbort> abort, NcclWatchdog* watchdog, NcclWaitTimer* timer,
           cudaStream_t compute_stream, std::string description, absl::Duration timeout,
           Blame blame)
      : status_(std::move(status)),
        operation_(std::move(operation)),
        abort_(std::move(abort)),
        watchdog_(watchdog),
        timer_(timer),
        compute_stream_(compute_stream),
        description_(std::move(description)),
        timeout_(timeout),
        blame_(blame) {}
  ~NcclWork() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    if (done_ || !status_.ok()) return status_;
    for (;;) {
      const cudaError_t query = cudaEventQuery(operation_->event);
      if (query == cudaSuccess) break;
      ncclResult_t async_error = ncclSuccess;
      ncclCommGetAsyncError(abort_->comm(), &async_error);
      if (operation_->timed_out || absl::Now() > operation_->deadline) {
        abort_->Abort();  // unblocks the streams; the communicator is unusable after
        Fail(absl::DeadlineExceededError(absl::StrCat(description_, " did not finish within ",
                                                      absl::FormatDuration(timeout_))),
             /*timed_out=*/true);
        break;
      }
      if (query != cudaErrorNotReady || async_error != ncclSuccess) {
        Fail(absl::UnavailableError(absl::StrCat(description_, " failed: ",
                                                 async_error != ncclSuccess
                                                     ? ncclGetErrorString(async_error)
                                                     : cudaGetErrorString(query))),
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
    if (const cudaError_t e = timer_->Wait(compute_stream_, operation_->event); e != cudaSuccess) {
      status_ = CudaStatus(e, "cudaStreamWaitEvent (the compute stream on a collective)");
      return status_;
    }
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
    } else if (timed_out && blame_.peer_world_rank >= 0) {
      blamed.push_back(blame_.peer_world_rank);
      why = absl::StrCat("rank ", blame_.peer_world_rank,
                         " never completed its side (exited, crashed, hung, or issued other "
                         "operations)");
    } else {
      why = "a peer never issued it, exited, or issues different collectives";
    }
    status_ = absl::Status(failure.code(), absl::StrCat(failure.message(), ": ", why));
    SetFaultyRanks(status_, blamed);
  }

  absl::Status status_;
  std::shared_ptr<NcclOperation> operation_;
  std::shared_ptr<NcclAbort> abort_;
  NcclWatchdog* watchdog_;
  NcclWaitTimer* timer_;
  cudaStream_t compute_stream_;
  std::string description_;
  absl::Duration timeout_;
  Blame blame_;
  bool done_ = false;
};

// `waiting` waits on the device for the work already issued on `on`.
void StreamWaits(cudaStream_t waiting, cudaStream_t on) {
  cudaEvent_t event = nullptr;
  cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  cudaEventRecord(event, on);
  cudaStreamWaitEvent(waiting, event, 0);
  cudaEventDestroy(event);  // released once the wait is satisfied
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

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Store> store, const NcclCommunicatorOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("communicator '%s': rank %d is outside a group of size %d", options.name,
                        options.rank, options.size));
  }
  const std::string id_key = options.key_prefix + "nccl_id";
  ncclUniqueId id;
  if (options.rank == 0) {
    if (ncclResult_t result = ncclGetUniqueId(&id); result != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat(
          "communicator '", options.name, "': ncclGetUniqueId: ", ncclGetErrorString(result)));
    }
    RETURN_IF_ERROR(store->Set(id_key, std::string_view(id.internal, sizeof(id.internal))));
  } else {
    ASSIGN_OR_RETURN(std::string bytes, store->Get(id_key, options.timeout));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(
          absl::StrFormat("store key '%s' holds %d bytes, not an NCCL id", id_key, bytes.size()));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  // ncclCommInitRank waits for every member without a timeout: the members meet in the store
  // first, so that one that never comes fails the others here, after the timeout, named.
  const std::string joined_key = options.key_prefix + "nccl_joined";
  const std::string ready_key = options.key_prefix + "nccl_ready";
  ASSIGN_OR_RETURN(const int64_t joined, store->Add(joined_key, 1));
  if (joined == options.size) RETURN_IF_ERROR(store->Set(ready_key, "1"));
  if (absl::Status ready = store->Wait({ready_key}, options.timeout); !ready.ok()) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "communicator '%s': %d of %d ranks joined within %s (the others never reached their "
        "NCCL setup: see their logs): %s",
        options.name, store->Add(joined_key, 0).value_or(joined), options.size,
        absl::FormatDuration(options.timeout), ready.message()));
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t result = ncclCommInitRank(&comm, options.size, id, options.rank);
      result != ncclSuccess) {
    return absl::UnavailableError(absl::StrFormat(
        "communicator '%s': rank %d of %d: ncclCommInitRank: %s (NCCL_DEBUG=INFO says more)",
        options.name, options.rank, options.size, ncclGetErrorString(result)));
  }
  cudaStream_t streams[3] = {};
  float* scalar = nullptr;
  int device = 0;
  absl::Status status = CudaStatus(cudaGetDevice(&device), "cudaGetDevice");
  for (cudaStream_t& stream : streams) {
    if (status.ok()) {
      status =
          CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    }
  }
  if (status.ok()) status = CudaStatus(cudaMalloc(&scalar, sizeof(float)), "cudaMalloc");
  if (!status.ok()) {
    for (cudaStream_t stream : streams) {
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
    ncclCommDestroy(comm);
    return status;
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      std::move(store), options, comm, device, streams[0], streams[1], streams[2], scalar));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Store> store, NcclCommunicatorOptions options,
                                   ncclComm_t comm, int device, cudaStream_t stream,
                                   cudaStream_t send_stream, cudaStream_t recv_stream,
                                   float* barrier_scalar)
    : options_(std::move(options)),
      // Under its own keys: a Gloo communicator of the same prefix numbers its collectives apart.
      progress_(std::move(store), options_.key_prefix + "nccl_", options_.rank, options_.size,
                options_.world_ranks),
      abort_(std::make_shared<NcclAbort>(comm)),
      watchdog_(device, abort_),
      stream_(stream),
      send_stream_(send_stream),
      recv_stream_(recv_stream),
      barrier_scalar_(barrier_scalar) {}

NcclCommunicator::~NcclCommunicator() {
  for (cudaStream_t stream : {stream_, send_stream_, recv_stream_}) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  cudaFree(barrier_scalar_);
  if (!abort_->aborted()) ncclCommDestroy(abort_->comm());
}

int NcclCommunicator::WorldRank(int group_rank) const {
  // A peer outside the group (NCCL refuses it) is named as given.
  if (options_.world_ranks.empty() || group_rank < 0 || group_rank >= options_.size) {
    return group_rank;
  }
  return options_.world_ranks[group_rank];
}

std::unique_ptr<Work> NcclCommunicator::Finish(absl::string_view op_name, ncclResult_t enqueued,
                                               cudaStream_t stream, int peer) {
  std::string description = absl::StrFormat("%s on group '%s' (%d ranks) at rank %d", op_name,
                                            options_.name, options_.size, WorldRank(options_.rank));
  absl::Status status;
  cudaEvent_t event = nullptr;
  if (abort_->aborted()) {
    status = absl::FailedPreconditionError(
        absl::StrCat(description, ": the communicator was aborted after an operation timed out"));
  } else if (enqueued != ncclSuccess) {
    status = absl::UnavailableError(
        absl::StrCat(description, " failed to start: ", ncclGetErrorString(enqueued)));
  } else if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
             e != cudaSuccess || (e = cudaEventRecord(event, stream)) != cudaSuccess) {
    status = CudaStatus(e, "cudaEventRecord");
  }
  Blame blame{.progress = &progress_};
  if (peer >= 0) {
    blame.peer_world_rank = WorldRank(peer);
  } else if (status.ok()) {
    blame.seq = ++collective_seq_;
    progress_.Started(blame.seq);
  }
  return std::make_unique<NcclWork>(
      std::move(status), std::make_shared<NcclOperation>(event, absl::Now() + options_.timeout),
      abort_, &watchdog_, &wait_timer_, options_.compute_stream, std::move(description),
      options_.timeout, blame);
}

void NcclCommunicator::Count(OpStats CommStats::*field, int64_t sent, int64_t received) {
  std::lock_guard lock(mu_);
  OpStats& stats = stats_.*field;
  stats.calls += 1;
  stats.bytes_sent += sent;
  stats.bytes_received += received;
}

void NcclCommunicator::OrderBefore(cudaStream_t stream) {
  if (options_.compute_stream != nullptr) StreamWaits(stream, options_.compute_stream);
  if (stream != stream_) StreamWaits(stream, stream_);
}

std::unique_ptr<Work> NcclCommunicator::AllReduce(void* data, size_t count, DataType type,
                                                  ReduceOp op) {
  if (absl::Status valid = CheckReduction(type, op, "all_reduce", options_.name); !valid.ok()) {
    return FinishedWork(std::move(valid));
  }
  const int64_t bytes = static_cast<int64_t>(count) * DataTypeBytes(type);
  const int64_t ring_bytes = 2 * (options_.size - 1) * bytes / options_.size;
  Count(&CommStats::all_reduce, ring_bytes, ring_bytes);
  OrderBefore(stream_);
  return Finish(
      "all_reduce",
      ncclAllReduce(data, data, count, NcclType(type), NcclOp(op), abort_->comm(), stream_),
      stream_);
}

std::unique_ptr<Work> NcclCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                                      DataType type, ReduceOp op) {
  if (absl::Status valid = CheckReduction(type, op, "reduce_scatter", options_.name); !valid.ok()) {
    return FinishedWork(std::move(valid));
  }
  const int64_t ring_bytes =
      (options_.size - 1) * static_cast<int64_t>(count) * DataTypeBytes(type);
  Count(&CommStats::reduce_scatter, ring_bytes, ring_bytes);
  OrderBefore(stream_);
  return Finish(
      "reduce_scatter",
      ncclReduceScatter(input, output, count, NcclType(type), NcclOp(op), abort_->comm(), stream_),
      stream_);
}

std::unique_ptr<Work> NcclCommunicator::AllGather(const void* input, void* output, size_t count,
                                                  DataType type) {
  const int64_t ring_bytes =
      (options_.size - 1) * static_cast<int64_t>(count) * DataTypeBytes(type);
  Count(&CommStats::all_gather, ring_bytes, ring_bytes);
  OrderBefore(stream_);
  return Finish("all_gather",
                ncclAllGather(input, output, count, NcclType(type), abort_->comm(), stream_),
                stream_);
}

std::unique_ptr<Work> NcclCommunicator::Broadcast(void* data, size_t count, DataType type,
                                                  int root) {
  // NCCL's broadcast is a chain from the root: every rank but the last forwards the buffer.
  const int position = (options_.rank - root + options_.size) % options_.size;
  const int64_t bytes = static_cast<int64_t>(count) * DataTypeBytes(type);
  Count(&CommStats::broadcast, position < options_.size - 1 ? bytes : 0, position > 0 ? bytes : 0);
  OrderBefore(stream_);
  return Finish("broadcast",
                ncclBroadcast(data, data, count, NcclType(type), root, abort_->comm(), stream_),
                stream_);
}

std::unique_ptr<Work> NcclCommunicator::Send(const void* data, size_t count, DataType type,
                                             int peer) {
  Count(&CommStats::send, static_cast<int64_t>(count) * DataTypeBytes(type), 0);
  OrderBefore(send_stream_);
  return Finish(absl::StrCat("send to rank ", WorldRank(peer)),
                ncclSend(data, count, NcclType(type), peer, abort_->comm(), send_stream_),
                send_stream_, peer);
}

std::unique_ptr<Work> NcclCommunicator::Recv(void* data, size_t count, DataType type, int peer) {
  Count(&CommStats::recv, 0, static_cast<int64_t>(count) * DataTypeBytes(type));
  OrderBefore(recv_stream_);
  return Finish(absl::StrCat("recv from rank ", WorldRank(peer)),
                ncclRecv(data, count, NcclType(type), peer, abort_->comm(), recv_stream_),
                recv_stream_, peer);
}

absl::Status NcclCommunicator::Barrier() {
  return Finish("barrier",
                ncclAllReduce(barrier_scalar_, barrier_scalar_, 1, ncclFloat32, ncclSum,
                              abort_->comm(), stream_),
                stream_)
      ->Wait();
}

double NcclCommunicator::TakeDeviceWaitMs() { return wait_timer_.TakeMs(); }

CommStats NcclCommunicator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace dtrain
