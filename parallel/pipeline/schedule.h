// Pipeline schedules as data (DESIGN.md): a pure function turns (schedule, stages, virtual
// stages, micro-batches, stage) into the ordered actions that one executor runs on that stage.
//
// Placement: the model is cut into stages x virtual_stages contiguous model chunks; stage s
// holds chunks s, s + stages, s + 2 * stages, ... ("loop" placement, as Megatron-LM and
// torch.distributed.pipelining), so an action's `chunk` (0 .. virtual_stages - 1) is model chunk
// chunk * stages + stage. Model chunk 0 starts with the embedding; the last ends with the final
// norm, the head and the loss.
//
// The executor's contract (which tests/parallel/pipeline/schedule_test.cc simulates for every
// schedule, 1..8 stages, 1..4 virtual stages and 1, p, 2p + 1 micro-batches): actions run in
// list order. A receive is posted where it is listed, never waited for there: the compute that
// needs it (kForward / kBackward of the same micro-batch and chunk, later in the list) waits for
// it. A send is posted after its compute and waited for only when its buffer is reused. The
// n-th send from stage a to stage b carries what b's n-th receive from a expects (the
// Communicator matches per peer in order), so an activation can never be taken for a gradient.
// To keep that order, a receive may be listed a few computes before the one that needs it (two
// stages with interleaving, where one neighbour sends both kinds). Neither a send nor a receive
// is listed between chunks on the same stage (stages == 1). No schedule deadlocks when sends
// are posted without waiting for the peer's receive (Communicator::Send's contract).
//
// Pure and thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

enum class PipelineSchedule {
  kGpipe,        // every forward, then every backward (micro-batch order): m activations live
  kOneFOneB,     // Megatron's 1F1B: warm-up forwards, then one forward one backward, cool-down
  kInterleaved,  // Megatron's interleaved 1F1B over virtual_stages chunks per stage
};

absl::string_view PipelineScheduleName(PipelineSchedule schedule);  // "gpipe" | "1f1b" | ...
// The recipe spelling; anything else is InvalidArgument naming parallel.pp_schedule.
absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(absl::string_view name);

struct PipelineShape {
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int stages = 1;          // parallel.pp
  int virtual_stages = 1;  // parallel.pp_virtual_stages: chunks per stage
  int micro_batches = 1;   // per pipeline per optimizer step
};

// OK when StageActions can build the shape: stages, virtual stages and micro-batches >= 1, and
// virtual_stages == 1 unless the schedule is interleaved. Otherwise InvalidArgument naming the
// recipe keys and the fix. Interleaved with one virtual stage is 1F1B (as in Megatron-LM, where
// one virtual stage means no interleaving). Any micro-batch count works for every schedule
// (see InterleavedGroupSize).
absl::Status CheckPipelineShape(const PipelineShape& shape);

// Interleaving runs micro-batches in groups of G (Megatron-LM's
// microbatch_group_size_per_vp_stage): all of a group's chunk-0 forwards, then its chunk-1
// forwards, and so on. Megatron-LM takes G = p and needs G in [p, m] and a last group of 0 or
// >= p micro-batches: a shorter last group deadlocks (stage 0 would need chunk c + 1's input
// before the last stage, waiting on stage 0's backward, could send it). G here is the smallest
// value that Megatron-LM accepts: p when p divides m, more otherwise (m = 2p + 1 gives p + 1),
// and m when m < p (one group; Megatron-LM refuses m < p). A larger G holds more activations.
int InterleavedGroupSize(const PipelineShape& shape);

enum class PipelineActionKind {
  kRecvForward,   // the chunk's input activation from `peer` (the previous model chunk's stage)
  kForward,       // forward of (micro_batch, chunk); keeps its activations for the backward
  kSendForward,   // the chunk's output activation to `peer` (the next model chunk's stage)
  kRecvBackward,  // the gradient of the chunk's output from `peer`
  kBackward,      // backward of (micro_batch, chunk); frees its activations
  kSendBackward,  // the gradient of the chunk's input to `peer`
};

struct PipelineAction {
  PipelineActionKind kind = PipelineActionKind::kForward;
  int micro_batch = 0;
  int chunk = 0;  // virtual chunk on this stage, 0 .. virtual_stages - 1
  int peer = -1;  // the other stage of a send or receive; -1 for compute

  friend bool operator==(const PipelineAction&, const PipelineAction&) = default;
};

// Compact form for logs and test messages: "F3.1" (forward, micro-batch 3, chunk 1),
// "B0.0", "sendF3.1->2", "recvB0.0<-1".
std::string FormatAction(const PipelineAction& action);

// The ordered actions of `stage` (0 .. shape.stages - 1) for one optimizer step. Every
// (micro-batch, chunk) has one forward and, later, one backward. Errors: CheckPipelineShape's,
// and InvalidArgument for a stage outside the pipeline.
absl::StatusOr<std::vector<PipelineAction>> StageActions(const PipelineShape& shape, int stage);

// The warm-up of `stage`: forwards it runs before the steady one-forward-one-backward phase
// (Megatron-LM's num_warmup_microbatches). 1F1B min(m, p - stage - 1); interleaved
// min(m v, 2 (p - stage - 1) + (v - 1) G) with G = InterleavedGroupSize; gpipe m v (all). Under
// 1F1B and interleaved the steady phase starts with a forward, so a stage holds at most warm-up + 1
// micro-batches' activations. Precondition: CheckPipelineShape(shape) is OK.
int WarmupForwards(const PipelineShape& shape, int stage);

}  // namespace dtrain
