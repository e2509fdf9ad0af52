#include "parallel/comm/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/backend/cuda/bf16.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "parallel/comm/faulty_ranks.h"
#include "parallel/comm/gloo_store_adapter.h"

namespace dtrain {
namespace {

// The address ("[10.0.0.2]:41234", as Gloo's connection errors name it) that peer `peer` published
// for its connection with this context's rank, from the bytes its connectFullMesh stored, through
// Gloo's own extractAddress.
class PublishedAddresses : public gloo::rendezvous::Context {
 public:
  PublishedAddresses(int rank, int size) : gloo::rendezvous::Context(rank, size) {}
  std::string Of(int peer, std::vector<char> published) {
    return gloo::transport::tcp::Address(extractAddress(published, peer)).str();
  }
};

using gloo::transport::UnboundBuffer;

// Ring transfers are cut into segments so that reducing (or forwarding) one segment overlaps
// receiving the next: every chunk is at least kMinSegmentsPerChunk segments, each at most 1 MiB
// (per-message overhead small, scratch cache-friendly) and, where the chunk allows, at least
// kMinSegmentBytes (tiny messages cost more in handshakes than they win in overlap). Gloo's
// own ring all-reduce makes the same choice; with a single segment per chunk, the receive, the
// reduction and the forward of a chunk run one after another and 1-2 MiB all-reduces on two
// ranks ran at 0.4-0.8x of gloo::allreduce. Sizes are in bytes, so that every data type cuts
// its chunks where f32 does in bytes.
constexpr size_t kSegmentBytes = 1 << 20;
constexpr size_t kMinSegmentBytes = 16 << 10;
constexpr size_t kMinSegmentsPerChunk = 2;
// Receives in flight per ring, and scratch segments (twice as many, so that a segment being
// forwarded is not overwritten by a newer receive before its send completed).
constexpr size_t kRecvWindow = 4;
constexpr size_t kScratchSegments = 2 * kRecvWindow;

// Gloo slot prefixes for dtrain's algorithms, above the 0x01-0x08 that Gloo's own use.
constexpr uint64_t kReduceScatterSlot = 0x40;
constexpr uint64_t kAllGatherSlot = 0x41;
constexpr uint64_t kBroadcastSlot = 0x42;
constexpr uint64_t kPointToPointSlot = 0x43;
uint64_t Slot(uint64_t prefix, uint32_t tag) { return (prefix << 56) | tag; }

std::chrono::milliseconds Remaining(absl::Time deadline) {
  // Gloo treats 0 as "no timeout": never pass less than 1 ms.
  return std::max(std::chrono::milliseconds(1), absl::ToChronoMilliseconds(deadline - absl::Now()));
}

void WaitRecv(UnboundBuffer& buffer, absl::Time deadline) {
  if (!buffer.waitRecv(Remaining(deadline))) throw gloo::IoException("receive aborted");
}
void WaitSend(UnboundBuffer& buffer, absl::Time deadline) {
  if (!buffer.waitSend(Remaining(deadline))) throw gloo::IoException("send aborted");
}

// dst = a + b over n elements (dst may alias a or b).
template <typename T>
void Add(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
}

// dst = max(a, b) over n elements (dst may alias a or b).
template <typename T>
void Max(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = std::max(x[i], y[i]);
}

void MaxBFloat16(void* dst, const void* a, const void* b, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    d[i] = cuda::Bf16BitsToFloat(x[i]) >= cuda::Bf16BitsToFloat(y[i]) ? x[i] : y[i];
  }
}

void AddBFloat16(void* dst, const void* a, const void* b, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    d[i] = cuda::FloatToBf16Bits(cuda::Bf16BitsToFloat(x[i]) + cuda::Bf16BitsToFloat(y[i]));
  }
}

template <typename T>
void Divide(void* data, size_t count, int size) {
  T* values = static_cast<T*>(data);
  const T divisor = static_cast<T>(size);
  for (size_t i = 0; i < count; ++i) values[i] /= divisor;
}

void DivideBFloat16(void* data, size_t count, int size) {
  uint16_t* values = static_cast<uint16_t*>(data);
  const float divisor = static_cast<float>(size);
  for (size_t i = 0; i < count; ++i) {
    values[i] = cuda::FloatToBf16Bits(cuda::Bf16BitsToFloat(values[i]) / divisor);
  }
}

}  // namespace

// The arithmetic of one data type and reduction, called once per segment: the element loops
// stay as tight as a float-only ring's. `combine` adds for kSum and kAvg and takes the maximum
// for kMax; `divide` is null for the integers (CheckReduction rejects their kAvg).
struct GlooCommunicator::ElementOps {
  size_t bytes;
  void (*combine)(void* dst, const void* a, const void* b, size_t n);
  void (*divide)(void* data, size_t count, int size);
};

namespace {

const GlooCommunicator::ElementOps& OpsOf(DataType type, ReduceOp op) {
  using Ops = GlooCommunicator::ElementOps;
  static constexpr Ops kF32{4, Add<float>, Divide<float>};
  static constexpr Ops kBF16{2, AddBFloat16, DivideBFloat16};
  static constexpr Ops kF64{8, Add<double>, Divide<double>};
  // i64 adds as u64: the same bits, wrapping where a signed overflow would be undefined.
  static constexpr Ops kU64{8, Add<uint64_t>, nullptr};
  static constexpr Ops kF32Max{4, Max<float>, nullptr};
  static constexpr Ops kBF16Max{2, MaxBFloat16, nullptr};
  static constexpr Ops kF64Max{8, Max<double>, nullptr};
  static constexpr Ops kI64Max{8, Max<int64_t>, nullptr};
  static constexpr Ops kU64Max{8, Max<uint64_t>, nullptr};
  const bool max = op == ReduceOp::kMax;
  switch (type) {
    case DataType::kF32:
      return max ? kF32Max : kF32;
    case DataType::kBF16:
      return max ? kBF16Max : kBF16;
    case DataType::kF64:
      return max ? kF64Max : kF64;
    case DataType::kI64:
      return max ? kI64Max : kU64;
    case DataType::kU64:
      return max ? kU64Max : kU64;
  }
  return kF32;
}

// Chunk c of an all-reduce spans [offsets[c], offsets[c + 1]): as equal as possible.
std::vector<size_t> BalancedOffsets(size_t count, int size) {
  std::vector<size_t> offsets(size + 1);
  for (int c = 0; c <= size; ++c) {
    offsets[c] = count / size * c + std::min<size_t>(c, count % size);
  }
  return offsets;
}

std::vector<size_t> EqualOffsets(size_t count, int size) {
  std::vector<size_t> offsets(size + 1);
  for (int c = 0; c <= size; ++c) offsets[c] = count * c;
  return offsets;
}

// The segments of chunk [begin, end): (offset, length) pairs in elements of `element_bytes`. A
// function of the chunk and the type alone, so that the sender and the receiver cut it alike.
std::vector<std::pair<size_t, size_t>> Segments(size_t begin, size_t end, size_t element_bytes) {
  const size_t segment_elements_max = kSegmentBytes / element_bytes;
  const size_t min_segment_elements = kMinSegmentBytes / element_bytes;
  const size_t length = end - begin;
  const size_t count = std::max((length + segment_elements_max - 1) / segment_elements_max,
                                std::min(kMinSegmentsPerChunk, length / min_segment_elements));
  std::vector<std::pair<size_t, size_t>> segments;
  if (count <= 1) {
    if (length > 0) segments.emplace_back(begin, length);
    return segments;
  }
  const size_t segment_elements = (length + count - 1) / count;
  for (size_t offset = begin; offset < end; offset += segment_elements) {
    segments.emplace_back(offset, std::min(segment_elements, end - offset));
  }
  return segments;
}

std::unique_ptr<UnboundBuffer> Buffer(gloo::Context& context, const void* data, size_t bytes) {
  // Gloo's buffers are read-write by type; a send never writes.
  return context.createUnboundBuffer(const_cast<void*>(data), bytes);
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

struct GlooCommunicator::PointToPointLedger {
  std::mutex mu;
  OpStats send;
  OpStats recv;
  absl::Status failure;  // the first

  void Completed(bool is_send, size_t bytes) {
    std::lock_guard lock(mu);
    OpStats& total = is_send ? send : recv;
    total.calls += 1;
    (is_send ? total.bytes_sent : total.bytes_received) += static_cast<int64_t>(bytes);
  }
  void Failed(const absl::Status& status) {
    std::lock_guard lock(mu);
    if (failure.ok()) failure = status;
  }
};

struct GlooCommunicator::WorkState {
  std::mutex mu;
  std::condition_variable ran_cv;
  bool ran = false;
  absl::Status status;
  // Point to point only: the posted transfer, completed by the first Wait.
  std::unique_ptr<UnboundBuffer> transfer;
  bool is_send = false;
  size_t bytes = 0;
  int peer_world_rank = -1;
  absl::Time deadline;
  absl::Duration timeout;
  std::string description;  // "send of N bytes to rank R on group 'g'"
  std::shared_ptr<PointToPointLedger> ledger;
};

namespace {

class GlooWork : public Work {
 public:
  explicit GlooWork(std::shared_ptr<GlooCommunicator::WorkState> state)
      : state_(std::move(state)) {}
  ~GlooWork() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    GlooCommunicator::WorkState& state = *state_;
    std::unique_lock lock(state.mu);
    state.ran_cv.wait(lock, [&] { return state.ran; });
    if (!state.status.ok() || state.transfer == nullptr) return state.status;
    try {
      if (state.is_send) {
        WaitSend(*state.transfer, state.deadline);
      } else {
        WaitRecv(*state.transfer, state.deadline);
      }
      state.ledger->Completed(state.is_send, state.bytes);
    } catch (const std::exception& e) {
      // The peer is the one at fault: it never issued the matching operation, or it failed.
      const std::string what = e.what();
      const bool timed_out = what.find("Timed out") != std::string::npos;
      const std::string message = absl::StrCat(
          state.description, " did not complete",
          timed_out ? absl::StrCat(" (timeout ", absl::FormatDuration(state.timeout), ")") : "",
          ": the peer failed or never issued the matching operation; transport: ", what);
      state.status =
          timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
      SetFaultyRanks(state.status, {state.peer_world_rank});
      state.ledger->Failed(state.status);
    }
    state.transfer.reset();
    return state.status;
  }

 private:
  std::shared_ptr<GlooCommunicator::WorkState> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, const GlooCommunicatorOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("communicator '%s': rank %d is outside a group of size %d", options.name,
                        options.rank, options.size));
  }
  if (!options.world_ranks.empty() &&
      options.world_ranks.size() != static_cast<size_t>(options.size)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("communicator '%s': %d world ranks listed for a group of size %d",
                        options.name, options.world_ranks.size(), options.size));
  }
  // Gloo writes with writev, which raises SIGPIPE once a peer's socket is gone. A dead peer must
  // be an error this rank reports, not a signal that kills it (the launcher would then name this
  // rank as the root cause). Process-wide, as Python, and so every torch.distributed worker, has
  // it from start-up.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    // Gloo waits 5 times a pair's timeout for its first connection (transport/tcp/pair.h), and
    // a pair keeps the context's timeout of its creation: a fifth here makes the connect's wait
    // the timeout. The store's waits keep all of it (GlooStoreAdapter), and every operation
    // after passes its own deadline.
    context->setTimeout(
        absl::ToChronoMilliseconds(std::max(options.timeout / 5, absl::Milliseconds(1))));
    GlooStoreAdapter adapter(store, options.key_prefix + "gloo/", options.timeout);
    context->connectFullMesh(adapter, device);
    context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(std::move(store), options, std::move(context)));
  } catch (const std::exception& e) {
    // Every member publishes its address under its rank: the keys that never appeared name the
    // ranks that never joined.
    std::vector<int> missing;
    for (int r = 0; r < options.size; ++r) {
      if (r == options.rank) continue;
      const std::string key = absl::StrCat(options.key_prefix, "gloo/", r);
      if (!store->Get(key, absl::Milliseconds(1)).ok()) {
        missing.push_back(options.world_ranks.empty() ? r : options.world_ranks[r]);
      }
    }
    // Every rank joined: Gloo's error names the address of the connection that failed, which
    // the peer it belongs to published.
    std::vector<int> unreachable;
    if (missing.empty()) {
      PublishedAddresses addresses(options.rank, options.size);
      for (int r = 0; r < options.size; ++r) {
        if (r == options.rank) continue;
        const absl::StatusOr<std::string> published =
            store->Get(absl::StrCat(options.key_prefix, "gloo/", r), absl::Milliseconds(1));
        if (!published.ok()) continue;
        try {
          const std::string address =
              addresses.Of(r, std::vector<char>(published->begin(), published->end()));
          if (std::strstr(e.what(), address.c_str()) != nullptr) {
            unreachable.push_back(options.world_ranks.empty() ? r : options.world_ranks[r]);
          }
        } catch (const std::exception&) {
          // Not an address Gloo wrote: nobody to name from it.
        }
      }
    }
    const std::string who =
        !missing.empty()       ? absl::StrCat("rank(s) ", absl::StrJoin(missing, ", "),
                                              " never joined (exited, crashed or not started)")
        : !unreachable.empty() ? absl::StrCat("every rank joined, but the connection to rank(s) ",
                                              absl::StrJoin(unreachable, ", "),
                                              " failed (hung, stopped, or unreachable from here)")
                               : "every rank joined, but a connection failed";
    absl::Status error = absl::UnavailableError(absl::StrFormat(
        "communicator '%s': rank %d of %d could not connect to its peers through %s within "
        "%s: %s; check that every rank started and that peers can reach this address (%s)",
        options.name, options.rank, options.size, options.hostname,
        absl::FormatDuration(options.timeout), who, e.what()));
    SetFaultyRanks(error, missing.empty() ? unreachable : missing);
    return error;
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<Store> store, GlooCommunicatorOptions options,
                                   std::shared_ptr<gloo::Context> context)
    : options_(std::move(options)),
      store_(std::move(store)),
      context_(std::move(context)),
      ledger_(std::make_shared<PointToPointLedger>()),
      scratch_(kScratchSegments * kSegmentBytes),
      progress_(store_, options_.key_prefix, options_.rank, options_.size, options_.world_ranks) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  queue_changed_.notify_all();
  worker_.join();
}

void GlooCommunicator::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      queue_changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every issued operation ran
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

std::unique_ptr<Work> GlooCommunicator::Enqueue(Task task) {
  auto state = std::make_shared<WorkState>();
  {
    std::lock_guard lock(mu_);
    queue_.push_back([task = std::move(task), state] {
      absl::Status status = task(*state);
      {
        std::lock_guard state_lock(state->mu);
        state->status = std::move(status);
        state->ran = true;
      }
      state->ran_cv.notify_all();  // unlocked: the waiter does not wake into a held mutex
    });
  }
  queue_changed_.notify_one();  // only the worker waits on it
  return std::make_unique<GlooWork>(std::move(state));
}

bool GlooCommunicator::Broken() {
  if (broken_.ok()) {
    std::lock_guard lock(ledger_->mu);
    broken_ = ledger_->failure;
  }
  return !broken_.ok();
}

absl::Status GlooCommunicator::FailedEarlier(const std::string& operation) const {
  // The ranks the first failure blamed stay blamed: the status a caller reports may be this one
  // (an earlier Work's status can be dropped unwaited).
  absl::Status status = absl::FailedPreconditionError(
      absl::StrCat(operation, " not run: the communicator failed earlier: ", broken_.message()));
  SetFaultyRanks(status, FaultyRanks(broken_));
  return status;
}

std::unique_ptr<Work> GlooCommunicator::EnqueueCollective(
    const char* op_name, OpStats CommStats::*stats_field,
    std::function<void(absl::Time, OpStats&)> body) {
  return Enqueue([this, op_name, stats_field, body = std::move(body)](WorkState&) {
    const int64_t seq = ++collective_seq_;
    if (Broken()) {
      return FailedEarlier(absl::StrFormat("%s #%d on group '%s'", op_name, seq, options_.name));
    }
    progress_.Started(seq);
    const absl::Time start = absl::Now();
    OpStats delta;
    delta.calls = 1;
    absl::Status status;
    try {
      body(start + options_.timeout, delta);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = what.find("Timed out") != std::string::npos;
      std::vector<int> blamed;
      const std::string arrivals = progress_.Diagnose(seq, timed_out, blamed);
      const std::string message = absl::StrFormat(
          "%s #%d on group '%s' (%d ranks) failed at rank %d after %s%s: %s; transport: %s",
          op_name, seq, options_.name, options_.size, WorldRank(options_.rank),
          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
          timed_out ? absl::StrCat(" (timeout ", absl::FormatDuration(options_.timeout), ")") : "",
          arrivals, what);
      status = timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
      SetFaultyRanks(status, blamed);
      broken_ = status;
    }
    if (stats_field == nullptr) return status;
    std::lock_guard lock(mu_);
    OpStats& total = stats_.*stats_field;
    total.calls += delta.calls;
    total.bytes_sent += delta.bytes_sent;
    total.bytes_received += delta.bytes_received;
    return status;
  });
}

// Reduce-scatter on a ring: at step t (0 .. n-2) rank r sends chunk r-t-1 to rank r+1 and
// receives chunk r-t-2 from rank r-1, adds its own contribution and forwards it at step t+1;
// after n-1 steps chunk r holds every rank's sum. With `in_place` (all-reduce) the partial sums
// accumulate in the caller's buffer; otherwise in the receive scratch, and the last step writes
// `output`. Receives are posted kRecvWindow segments ahead. Offsets and lengths are in
// elements; `at` turns them into byte addresses.
void GlooCommunicator::RingReduceScatter(const std::byte* input, std::byte* in_place,
                                         std::byte* output, const ElementOps& ops,
                                         const std::vector<size_t>& offsets, absl::Time deadline,
                                         OpStats& delta) {
  const int n = options_.size;
  const int r = options_.rank;
  const int left = Mod(r - 1, n);
  const int right = Mod(r + 1, n);
  const size_t e = ops.bytes;
  const uint64_t slot = Slot(kReduceScatterSlot, static_cast<uint32_t>(collective_seq_));
  if (n == 1) {
    if (in_place == nullptr) std::memcpy(output, input, offsets[1] * e);
    return;
  }
  gloo::Context& context = *context_;

  struct Item {
    int step;
    size_t offset;  // in the full buffer, elements
    size_t length;
  };
  std::vector<Item> receives;
  for (int t = 0; t + 1 < n; ++t) {
    const int c = Mod(r - t - 2, n);
    for (auto [offset, length] : Segments(offsets[c], offsets[c + 1], e)) {
      receives.push_back({t, offset, length});
    }
  }

  std::unique_ptr<UnboundBuffer> source =
      Buffer(context, in_place ? in_place : input, offsets[n] * e);
  int source_sends = 0;
  std::vector<std::unique_ptr<UnboundBuffer>> scratch(kScratchSegments);
  std::vector<bool> scratch_sending(kScratchSegments, false);
  for (size_t s = 0; s < kScratchSegments; ++s) {
    scratch[s] = Buffer(context, scratch_.data() + s * kSegmentBytes, kSegmentBytes);
  }
  auto post_receive = [&](size_t k) {
    const size_t s = k % kScratchSegments;
    if (scratch_sending[s]) {
      WaitSend(*scratch[s], deadline);
      scratch_sending[s] = false;
    }
    scratch[s]->recv(left, slot, 0, receives[k].length * e);
    delta.bytes_received += receives[k].length * e;
  };

  // Step 0 forwards this rank's own contribution to chunk r-1.
  const int first = Mod(r - 1, n);
  for (auto [offset, length] : Segments(offsets[first], offsets[first + 1], e)) {
    source->send(right, slot, offset * e, length * e);
    delta.bytes_sent += length * e;
    ++source_sends;
  }
  for (size_t k = 0; k < std::min(kRecvWindow, receives.size()); ++k) post_receive(k);
  for (size_t k = 0; k < receives.size(); ++k) {
    const Item& item = receives[k];
    const size_t s = k % kScratchSegments;
    std::byte* received = scratch_.data() + s * kSegmentBytes;
    WaitRecv(*scratch[s], deadline);
    const bool last = item.step == n - 2;
    const size_t bytes = item.length * e;
    if (in_place != nullptr) {
      std::byte* partial = in_place + item.offset * e;
      ops.combine(partial, partial, received, item.length);
      if (!last) {
        source->send(right, slot, item.offset * e, bytes);
        ++source_sends;
      }
    } else if (last) {
      ops.combine(output + (item.offset - offsets[r]) * e, input + item.offset * e, received,
                  item.length);
    } else {
      ops.combine(received, received, input + item.offset * e, item.length);
      scratch[s]->send(right, slot, 0, bytes);
      scratch_sending[s] = true;
    }
    if (!last) delta.bytes_sent += bytes;
    if (k + kRecvWindow < receives.size()) post_receive(k + kRecvWindow);
  }
  for (size_t s = 0; s < kScratchSegments; ++s) {
    if (scratch_sending[s]) WaitSend(*scratch[s], deadline);
  }
  for (int i = 0; i < source_sends; ++i) WaitSend(*source, deadline);
}

// All-gather on a ring, in place: chunk r is already in `data`; at step t rank r forwards chunk
// r-t to rank r+1 and receives chunk r-t-1 from rank r-1, straight into `data`.
void GlooCommunicator::RingAllGather(std::byte* data, size_t element_bytes,
                                     const std::vector<size_t>& offsets, absl::Time deadline,
                                     OpStats& delta) {
  const int n = options_.size;
  const int r = options_.rank;
  const int left = Mod(r - 1, n);
  const int right = Mod(r + 1, n);
  const size_t e = element_bytes;
  const uint64_t slot = Slot(kAllGatherSlot, static_cast<uint32_t>(collective_seq_));
  std::unique_ptr<UnboundBuffer> buffer = Buffer(*context_, data, offsets[n] * e);
  int receives = 0;
  int sends = 0;
  // Every receive targets its own range, so all can be posted at once; they complete in order.
  for (int t = 0; t + 1 < n; ++t) {
    const int c = Mod(r - t - 1, n);
    for (auto [offset, length] : Segments(offsets[c], offsets[c + 1], e)) {
      buffer->recv(left, slot, offset * e, length * e);
      delta.bytes_received += length * e;
      ++receives;
    }
  }
  for (int t = 0; t + 1 < n; ++t) {
    const int c = Mod(r - t, n);
    for (auto [offset, length] : Segments(offsets[c], offsets[c + 1], e)) {
      if (t > 0) {  // chunk r-t arrived at step t-1
        WaitRecv(*buffer, deadline);
        --receives;
      }
      buffer->send(right, slot, offset * e, length * e);
      delta.bytes_sent += length * e;
      ++sends;
    }
  }
  for (; receives > 0; --receives) WaitRecv(*buffer, deadline);
  for (; sends > 0; --sends) WaitSend(*buffer, deadline);
}

// Broadcast along the chain root, root+1, ...: each rank forwards a segment as soon as it has
// it, so large messages move at link speed (the latency is n-1 segment hops).
void GlooCommunicator::ChainBroadcast(std::byte* data, size_t count, size_t element_bytes, int root,
                                      absl::Time deadline, OpStats& delta) {
  const int n = options_.size;
  const int position = Mod(options_.rank - root, n);
  const int previous = Mod(options_.rank - 1, n);
  const int next = Mod(options_.rank + 1, n);
  const bool forwards = position < n - 1;
  const size_t e = element_bytes;
  const uint64_t slot = Slot(kBroadcastSlot, static_cast<uint32_t>(collective_seq_));
  std::unique_ptr<UnboundBuffer> buffer = Buffer(*context_, data, count * e);
  const auto segments = Segments(0, count, e);
  if (position > 0) {
    for (auto [offset, length] : segments) {
      buffer->recv(previous, slot, offset * e, length * e);
      delta.bytes_received += length * e;
    }
  }
  for (auto [offset, length] : segments) {
    if (position > 0) WaitRecv(*buffer, deadline);
    if (forwards) {
      buffer->send(next, slot, offset * e, length * e);
      delta.bytes_sent += length * e;
    }
  }
  if (forwards) {
    for (size_t i = 0; i < segments.size(); ++i) WaitSend(*buffer, deadline);
  }
}

std::unique_ptr<Work> GlooCommunicator::AllReduce(void* data, size_t count, DataType type,
                                                  ReduceOp op) {
  if (absl::Status valid = CheckReduction(type, op, "all_reduce", options_.name); !valid.ok()) {
    return FinishedWork(std::move(valid));
  }
  const ElementOps* ops = &OpsOf(type, op);
  std::byte* bytes = static_cast<std::byte*>(data);
  return EnqueueCollective("all_reduce", &CommStats::all_reduce,
                           [this, bytes, count, ops, op](absl::Time deadline, OpStats& delta) {
                             if (count == 0) return;
                             const auto offsets = BalancedOffsets(count, options_.size);
                             RingReduceScatter(bytes, bytes, nullptr, *ops, offsets, deadline,
                                               delta);
                             RingAllGather(bytes, ops->bytes, offsets, deadline, delta);
                             if (op == ReduceOp::kAvg) ops->divide(bytes, count, options_.size);
                           });
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                                      DataType type, ReduceOp op) {
  if (absl::Status valid = CheckReduction(type, op, "reduce_scatter", options_.name); !valid.ok()) {
    return FinishedWork(std::move(valid));
  }
  const ElementOps* ops = &OpsOf(type, op);
  const std::byte* in = static_cast<const std::byte*>(input);
  std::byte* out = static_cast<std::byte*>(output);
  return EnqueueCollective("reduce_scatter", &CommStats::reduce_scatter,
                           [this, in, out, count, ops, op](absl::Time deadline, OpStats& delta) {
                             if (count == 0) return;
                             RingReduceScatter(in, nullptr, out, *ops,
                                               EqualOffsets(count, options_.size), deadline, delta);
                             if (op == ReduceOp::kAvg) ops->divide(out, count, options_.size);
                           });
}

std::unique_ptr<Work> GlooCommunicator::AllGather(const void* input, void* output, size_t count,
                                                  DataType type) {
  const size_t e = DataTypeBytes(type);
  const std::byte* in = static_cast<const std::byte*>(input);
  std::byte* out = static_cast<std::byte*>(output);
  return EnqueueCollective("all_gather", &CommStats::all_gather,
                           [this, in, out, count, e](absl::Time deadline, OpStats& delta) {
                             if (count == 0) return;
                             std::byte* own = out + options_.rank * count * e;
                             if (own != in) std::memcpy(own, in, count * e);
                             RingAllGather(out, e, EqualOffsets(count, options_.size), deadline,
                                           delta);
                           });
}

std::unique_ptr<Work> GlooCommunicator::Broadcast(void* data, size_t count, DataType type,
                                                  int root) {
  const size_t e = DataTypeBytes(type);
  std::byte* bytes = static_cast<std::byte*>(data);
  return EnqueueCollective("broadcast", &CommStats::broadcast,
                           [this, bytes, count, e, root](absl::Time deadline, OpStats& delta) {
                             if (root < 0 || root >= options_.size) {
                               throw gloo::InvalidOperationException(
                                   absl::StrCat("broadcast root ", root, " is not a group rank"));
                             }
                             if (count == 0) return;
                             ChainBroadcast(bytes, count, e, root, deadline, delta);
                           });
}

absl::Status GlooCommunicator::Barrier() {
  return EnqueueCollective("barrier", nullptr,
                           [this](absl::Time deadline, OpStats&) {
                             gloo::BarrierOptions options(context_);
                             options.setTag(static_cast<uint32_t>(collective_seq_));
                             options.setTimeout(Remaining(deadline));
                             gloo::barrier(options);
                           })
      ->Wait();
}

std::unique_ptr<Work> GlooCommunicator::EnqueuePointToPoint(bool is_send, void* data, size_t bytes,
                                                            int peer) {
  return Enqueue([this, is_send, data, bytes, peer](WorkState& state) -> absl::Status {
    const std::string description = absl::StrFormat(
        "%s of %d bytes %s rank %d on group '%s' (this is rank %d)", is_send ? "send" : "recv",
        bytes, is_send ? "to" : "from", peer >= 0 && peer < options_.size ? WorldRank(peer) : peer,
        options_.name, WorldRank(options_.rank));
    if (peer < 0 || peer >= options_.size || peer == options_.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(description, ": the peer must be another rank of the group"));
    }
    if (Broken()) return FailedEarlier(description);
    if (bytes == 0) {
      ledger_->Completed(is_send, 0);
      return absl::OkStatus();
    }
    try {
      state.transfer = Buffer(*context_, data, bytes);
      if (is_send) {
        state.transfer->send(peer, kPointToPointSlot << 56);
      } else {
        state.transfer->recv(peer, kPointToPointSlot << 56);
      }
    } catch (const std::exception& e) {
      absl::Status status =
          absl::UnavailableError(absl::StrCat(description, " failed: ", e.what()));
      SetFaultyRanks(status, {WorldRank(peer)});
      broken_ = status;
      return status;
    }
    state.is_send = is_send;
    state.bytes = bytes;
    state.peer_world_rank = WorldRank(peer);
    state.deadline = absl::Now() + options_.timeout;
    state.timeout = options_.timeout;
    state.description = description;
    state.ledger = ledger_;
    return absl::OkStatus();
  });
}

std::unique_ptr<Work> GlooCommunicator::Send(const void* data, size_t count, DataType type,
                                             int peer) {
  return EnqueuePointToPoint(true, const_cast<void*>(data), count * DataTypeBytes(type), peer);
}

std::unique_ptr<Work> GlooCommunicator::Recv(void* data, size_t count, DataType type, int peer) {
  return EnqueuePointToPoint(false, data, count * DataTypeBytes(type), peer);
}

CommStats GlooCommunicator::stats() const {
  CommStats stats;
  {
    std::lock_guard lock(mu_);
    stats = stats_;
  }
  std::lock_guard lock(ledger_->mu);
  stats.send = ledger_->send;
  stats.recv = ledger_->recv;
  return stats;
}

}  // namespace dtrain
