// Collective communication among the ranks of one group ("world", "dp", "tp", "pp"): the
// interface the data-parallel engines, tensor parallel and the pipeline schedule call, with a
// Gloo backend for host buffers and an NCCL backend for device buffers.
//
// Contract: operations are asynchronous and run in issue order on the communicator's own
// thread (or CUDA stream); every rank of the group must issue the same collectives in the same
// order with the same counts. The caller keeps each buffer alive and untouched until the
// operation's Work::Wait returns. A failed or timed-out operation returns a Status that names
// the operation, the group and the ranks at fault; afterwards the communicator is unusable.
// Issuing operations is thread-compatible (one issuing thread); stats() is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "core/util/data_type.h"

namespace dtrain {

// kAvg is the sum divided by size(), applied once to the reduced result; floating types only.
// kMax is the elementwise maximum (i64 signed, u64 unsigned; a bf16 maximum rounds nothing): the
// vocabulary-parallel softmax's row maximum.
enum class ReduceOp { kSum, kAvg, kMax };

// Integers travel as integers and sum exactly (wrapping on overflow); kBF16 reduces in float and
// rounds each partial sum to bf16, as NCCL does.

// OK when `op` applies to `type`; otherwise an InvalidArgument naming the operation, the group
// and the fix. Backends check before issuing, so every rank rejects the same call alike.
absl::Status CheckReduction(DataType type, ReduceOp op, const char* op_name,
                            const std::string& group);

// OK when `rank` of a group of `size` may Send to or Recv from `peer`: the group was created for
// point-to-point use (GroupSpec::point_to_point, the pipeline's) and `peer` is the member before
// or after `rank` on the group's ring, the only pairs NCCL connects (nccl_communicator.h). Every
// mesh group holds to it on every backend (backend_memory_guard.h), so a CPU run fails where a
// GPU run would. Otherwise an error naming the operation and the group.
absl::Status CheckPointToPoint(bool point_to_point, int rank, int size, int peer,
                               const std::string& op_name, const std::string& group);

// The handle of one issued operation. Wait blocks until it finished and returns its outcome;
// calling Wait again returns the same outcome. Destroying an unwaited Work waits for it.
//
// WaitOnDevice orders the work issued afterwards on the buffers' compute stream (NCCL's
// compute_stream) after the operation, on the device, and returns without blocking the host: the
// caller may issue kernels that read the results at once, and must still call Wait (or destroy
// the Work) later to learn the outcome, and before the buffers go. An operation that outlives
// the timeout meanwhile is aborted by the communicator's watchdog, so the device never waits
// forever, and Wait reports it. An error known already is returned at once. Where operations do
// not run on a device stream (Gloo, or NCCL without a compute stream) it is Wait.
class Work {
 public:
  virtual ~Work() = default;
  virtual absl::Status Wait() = 0;
  virtual absl::Status WaitOnDevice() { return Wait(); }
};

// A Work that has already finished with `status`: the answer to an operation rejected before
// it was issued.
std::unique_ptr<Work> FinishedWork(absl::Status status);

// Bytes this rank moved through the transport for one kind of operation, as the algorithm
// sends them (payload only, no protocol headers). Local copies are not counted.
struct OpStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

struct CommStats {
  OpStats all_reduce;
  OpStats reduce_scatter;
  OpStats all_gather;
  OpStats broadcast;
  OpStats send;
  OpStats recv;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name for messages and logs ("world", "dp", ...).
  virtual const std::string& name() const = 0;

  // Every operation moves `count` elements of `type`; byte sizes follow from DataTypeBytes.
  // data (count): reduced across the group in place.
  virtual std::unique_ptr<Work> AllReduce(void* data, size_t count, DataType type, ReduceOp op) = 0;
  // input (size() * count) -> output (count): output = reduction of every rank's slice
  // [rank() * count, (rank() + 1) * count) of its input. A padded flat buffer's shard.
  virtual std::unique_ptr<Work> ReduceScatter(const void* input, void* output, size_t count,
                                              DataType type, ReduceOp op) = 0;
  // input (count) -> output (size() * count): rank r's input lands at output[r * count].
  virtual std::unique_ptr<Work> AllGather(const void* input, void* output, size_t count,
                                          DataType type) = 0;
  // data (count): root's values replace everyone else's.
  virtual std::unique_ptr<Work> Broadcast(void* data, size_t count, DataType type, int root) = 0;
  // Point to point: the n-th Send to a peer matches that peer's n-th Recv from this rank. A
  // Send does not wait for the matching Recv to be issued, so two ranks may Send to each other
  // before either Recvs.
  virtual std::unique_ptr<Work> Send(const void* data, size_t count, DataType type, int peer) = 0;
  virtual std::unique_ptr<Work> Recv(void* data, size_t count, DataType type, int peer) = 0;

  // The same operations on typed buffers: the element type names the data type.
  template <typename T>
  std::unique_ptr<Work> AllReduce(T* data, size_t count, ReduceOp op) {
    return AllReduce(static_cast<void*>(data), count, DataTypeOf<T>(), op);
  }
  template <typename T>
  std::unique_ptr<Work> ReduceScatter(const T* input, T* output, size_t count, ReduceOp op) {
    return ReduceScatter(static_cast<const void*>(input), static_cast<void*>(output), count,
                         DataTypeOf<T>(), op);
  }
  template <typename T>
  std::unique_ptr<Work> AllGather(const T* input, T* output, size_t count) {
    return AllGather(static_cast<const void*>(input), static_cast<void*>(output), count,
                     DataTypeOf<T>());
  }
  template <typename T>
  std::unique_ptr<Work> Broadcast(T* data, size_t count, int root) {
    return Broadcast(static_cast<void*>(data), count, DataTypeOf<T>(), root);
  }
  template <typename T>
  std::unique_ptr<Work> Send(const T* data, size_t count, int peer) {
    return Send(static_cast<const void*>(data), count, DataTypeOf<T>(), peer);
  }
  template <typename T>
  std::unique_ptr<Work> Recv(T* data, size_t count, int peer) {
    return Recv(static_cast<void*>(data), count, DataTypeOf<T>(), peer);
  }

  // Blocks until every rank of the group has reached the barrier (after its earlier operations).
  virtual absl::Status Barrier() = 0;
  // Milliseconds the compute stream spent waiting on the device for this communicator's
  // operations (Work::WaitOnDevice) that it has passed since the last call, timed with events:
  // the exposed communication no host wait sees. 0 where nothing waits on a device (Gloo).
  virtual double TakeDeviceWaitMs() { return 0; }

  // Totals since creation, counted when an operation finishes.
  virtual CommStats stats() const = 0;
  // The communicator whose operations stats() counts: a wrapper's inner one. Two groups over the
  // same communicator (groups of every rank share the world's) report the same totals.
  virtual const Communicator& counted() const { return *this; }
};

// Sums a and b over the ranks of `comm` and waits (no communicator: unchanged), in double:
// exact for counts below 2^53. What a group must agree on (evaluation, checkpoint signals,
// resume) goes through it.
absl::Status SumOverRanks(Communicator* comm, double& a, double& b);

}  // namespace dtrain
