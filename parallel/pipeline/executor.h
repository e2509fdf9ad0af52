// Runs one stage's pipeline actions (schedule.h's StageActions) for one optimizer step: the
// computes through a PipelineStage, the activations and gradients between stages through the
// pipeline group's Communicator (group rank = stage).
//
// The schedule's contract, kept here: a receive is posted where it is listed and waited for by
// the compute that needs it; a send is posted after its compute and never waited for where it
// would block on the peer. A send's buffer returns to the pool once the peer has provably posted
// the matching receive (it has since sent this stage a message it lists after that receive, so
// the wait returns at once), and the rest at the end of the step. Every wait is bounded by the
// communicator's per-operation timeout, so a stage that dies or hangs makes its neighbours fail
// within that timeout, and theirs in turn, never hang.
//
// Not thread-safe; one executor per stage, reused across steps (its buffers are pooled).
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/backend/backend.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/schedule.h"

namespace dtrain {

// What the model implements for the chunks of one stage. `chunk` is the virtual chunk on this
// stage (0 .. virtual_stages - 1), model chunk chunk * stages + stage (schedule.h). Activations
// and their gradients cross stage boundaries in the stage's activation type (b * t * C for a
// transformer).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  // The type of the activations and gradients the stages exchange, float32 or bf16: the same on
  // every stage.
  virtual DataType ActivationType() const = 0;

  // Elements of the chunk's input activation (0 on model chunk 0, which reads the tokens) and of
  // its output (0 on the last model chunk, which ends in the loss). The output count of model
  // chunk k must equal the input count of model chunk k + 1 on the next stage.
  virtual size_t InputCount(int chunk) const = 0;
  virtual size_t OutputCount(int chunk) const = 0;

  // Forward of (micro_batch, chunk). input (InputCount): null on model chunk 0; it stays valid
  // and unchanged until Backward of the same (micro_batch, chunk) returns, so the stage may keep
  // a pointer to it instead of a copy. output (OutputCount): null on the last model chunk; the
  // executor sends it (or hands it to the next chunk on this stage) once Forward returns.
  virtual absl::Status Forward(int micro_batch, int chunk, ConstValues input, Values output) = 0;
  // Backward of (micro_batch, chunk), after its Forward: accumulates the chunk's parameter
  // gradients and frees what Forward kept. d_output (OutputCount): the loss gradient of the
  // chunk's output, valid during the call; null on the last model chunk (its loss is the
  // output). d_input (InputCount): written with the gradient of the input; null on model chunk 0.
  virtual absl::Status Backward(int micro_batch, int chunk, ConstValues d_output,
                                Values d_input) = 0;
};

// Counters and timings of the last RunStep, for tests, metrics and memory logs.
struct PipelineExecutorStats {
  // Most (micro_batch, chunk) forwarded and not yet backwarded at once: the activations the
  // stage holds (1F1B: at most stages - stage; gpipe: every micro-batch).
  int peak_live_activations = 0;
  // Most buffers the executor held at once (inputs kept for backward, gradients received,
  // sends in flight) and their bytes, and the buffers it owns in all, pooled across steps.
  int peak_buffers_in_use = 0;
  size_t peak_buffer_bytes = 0;
  int buffers_allocated = 0;
  // Wall time of RunStep; of it, the time inside the stage's Forward and Backward, and the time
  // blocked waiting for a receive a compute needed or for a send to complete: the pipeline's
  // bubble as this stage sees it, with the transfers it could not hide. The rest (posting
  // operations, bookkeeping) is small. A stage that ends its step before its predecessors (the
  // last does, while they run their last backwards) idles after RunStep too: the stages' common
  // span is the longest step_ms, stage 0's.
  double step_ms = 0;
  double compute_ms = 0;
  double wait_ms = 0;
};

// Several steps' timings summed: a stage's idle share over a run.
struct PipelineStepTimes {
  int steps = 0;
  double step_ms = 0;
  double compute_ms = 0;
  double wait_ms = 0;

  void Add(const PipelineExecutorStats& stats);
  // "waited 123.4 ms of 567.8 ms (21.7%) in 9 steps, computing 400.1 ms".
  std::string Format() const;
};

// `cause` with a message that says where in the pipeline it happened, keeping its code and
// faulty-ranks payload: "pipeline stage S of N on group 'G': WHAT to (or from) stage P failed:
// CAUSE"; a peer of -1 names no stage, a null comm no group.
absl::Status PipelineFailure(const absl::Status& cause, int stage, int stages,
                             const Communicator* comm, absl::string_view what, bool send, int peer);

class PipelineExecutor {
 public:
  // `comm` is the pipeline group: size() == shape.stages, rank() == stage. It may be null for a
  // pipeline of one stage, which moves nothing. The buffers are `backend`'s memory (the
  // stage's). Errors: StageActions', and InvalidArgument when the communicator does not match
  // the shape.
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(const PipelineShape& shape,
                                                                  int stage, Communicator* comm,
                                                                  Backend& backend);

  // Runs every action of one step, in order. On an error (a compute's, or a send or receive
  // that failed or timed out) it waits for the operations already posted (each bounded by the
  // communicator's timeout) and returns a Status that keeps the cause's code and faulty-ranks
  // payload and names this stage, the action (FormatAction), the peer stage and the group. The
  // communicator is then unusable (communicator.h), and so is the step.
  absl::Status RunStep(PipelineStage& stage);

  const PipelineExecutorStats& stats() const { return stats_; }

  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

 private:
  // Backend memory from the pool, of which the first `count` values are in use.
  struct Buffer {
    DeviceBuffer memory;
    size_t count = 0;
    Values data() const { return memory.values(); }
  };
  // One buffer and the operation that reads or fills it, if any. The Work is declared after
  // the buffer so that it is destroyed first: destroying an unwaited Work waits for it, while
  // the buffer is still alive.
  struct Slot {
    Buffer buffer;
    std::unique_ptr<Work> work;  // null once waited, or for a local hand-over
    PipelineAction action;       // the receive or send, for messages
    int ordinal = 0;             // its index among this stage's receives from / sends to the peer
  };
  using Key = std::pair<int, int>;  // (micro_batch, chunk)

  PipelineExecutor(const PipelineShape& shape, int stage, Communicator* comm, Backend& backend,
                   std::vector<PipelineAction> actions);

  absl::Status RunAction(const PipelineAction& action, PipelineStage& stage);
  absl::Status RunForward(const PipelineAction& action, PipelineStage& stage);
  absl::Status RunBackward(const PipelineAction& action, PipelineStage& stage);
  // Posts a receive of `count` elements of the stage's type into a new slot of `into`.
  void PostRecv(const PipelineAction& action, size_t count, DataType type,
                std::map<Key, Slot>& into);
  // Posts the send of the slot a compute left in `from`.
  absl::Status PostSend(const PipelineAction& action, std::map<Key, Slot>& from);
  // Waits for the receive of `slot`, if still pending; then returns the sends to its peer that
  // are now known to be complete.
  absl::Status WaitRecv(Slot& slot);
  // Waits for `work`, counting the time blocked as the stage's wait.
  absl::Status TimedWait(Work& work);
  absl::Status ReclaimSends(int peer, bool all);

  Buffer Acquire(size_t count, DataType type);
  void Release(Buffer buffer);
  // Waits for every posted operation and drops the step's slots (after a failure).
  void Abandon();
  absl::Status Failed(const PipelineAction& action, const absl::Status& cause) const;

  const PipelineShape shape_;
  const int stage_;
  Communicator* const comm_;
  Backend& backend_;
  const std::vector<PipelineAction> actions_;
  // Per peer, per send ordinal to it: the ordinal of the first receive from that peer which the
  // peer sends after posting the receive matching the send (INT32_MAX: none this step).
  std::vector<std::vector<int>> send_safe_after_;

  // Per step.
  std::map<Key, Slot> inputs_;     // forward inputs, kept until the backward
  std::map<Key, Slot> d_outputs_;  // gradients of the outputs, until the backward
  std::map<Key, Slot> to_send_;    // computed, not yet posted (forward outputs, input gradients)
  std::vector<std::vector<Slot>> sends_;  // per peer, posted and not yet waited, in order
  std::vector<int> recvs_posted_;         // per peer
  std::vector<int> recvs_completed_;      // per peer: one past the newest receive waited for
  std::vector<int> sends_posted_;         // per peer
  int live_ = 0;
  int in_use_ = 0;
  size_t in_use_bytes_ = 0;
  std::chrono::steady_clock::duration compute_time_{};
  std::chrono::steady_clock::duration wait_time_{};

  std::vector<Buffer> pool_;
  PipelineExecutorStats stats_;
};

}  // namespace dtrain
