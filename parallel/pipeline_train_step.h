// One optimizer step of a pipeline stage (parallel.pp > 1; one model chunk per stage, or
// several under an interleaved schedule): the step's micro-batches forward and backward through
// this stage's chunks of the Transformer in the schedule's order (PipelineExecutor), the
// activations crossing stages over the pipeline group; then the tied embedding's two copies (GPT-2:
// the first stage's and the last stage's head) sum their gradients, the loss comes from the last
// stage to every stage, the squared gradient norm sums over the stages, and the engine clips and
// steps as in TrainStep.
#pragma once

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/param_table.h"
#include "core/model/transformer.h"
#include "core/recipe/recipe.h"
#include "parallel/comm/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/train_step.h"

namespace dtrain {

// (Micro-batch, chunk) passes in flight at once on `stage` (the Transformer's activation_slots):
// the warm-up forwards and the steady phase's one, at most every pass of the step.
int PipelineActivationSlots(const PipelineShape& shape, int stage);

// The model as a PipelineStage of the stage's chunks. It sits between the Transformer and the
// engine (the Transformer's BlockParameters) because the last stage runs the head's backward inside
// its forward: the head's GradientsReady is held back until that micro-batch's Backward has
// told the engine (BeginBackward), so that the engine sees the step's last backward complete
// every unit of the stage. A tied embedding's copy (GPT-2's embedding on the first stage, its
// head copy on the last) is held back for the whole step: its gradient is complete only once
// the other copy's is added (PipelineTrainStep), before the data-parallel reduction.
class TransformerPipelineStage : public PipelineStage, public BlockParameters {
 public:
  // `engine` must be in a pipelined step of shape.micro_batches (BeginPipelinedStep) while the
  // executor runs. The model must be built over this object with PipelineActivationSlots slots.
  TransformerPipelineStage(const ParamTable& table, DataParallelEngine& engine,
                           const PipelineShape& shape, int stage, int micro_batch, int seq_len);

  void set_model(Transformer* model) { model_ = model; }
  // The region holding this stage's copy of the tied embedding, whose readiness the step tells
  // the engine itself; none without a tied head, or on a stage between the first and the last.
  std::optional<int> tied_region() const { return tied_region_; }
  // The step's data: every micro-batch's inputs, targets and, for document data, positions (or
  // null), (micro_batches, b, t) each, valid until the step's last Backward; and the scale of the
  // loss sum's gradient.
  void BeginStep(const int32_t* inputs, const int32_t* targets, const int32_t* positions,
                 float grad_scale);

  // PipelineStage.
  DataType ActivationType() const override { return engine_.compute_type(); }
  size_t InputCount(int chunk) const override;
  size_t OutputCount(int chunk) const override;
  absl::Status Forward(int micro_batch, int chunk, ConstValues input, Values output) override;
  absl::Status Backward(int micro_batch, int chunk, ConstValues d_output, Values d_input) override;

  // BlockParameters: the engine's, but for the head's readiness on the last stage.
  DataType compute_type() const override { return engine_.compute_type(); }
  ConstValues Acquire(int region, Pass pass) override { return engine_.Acquire(region, pass); }
  void Release(int region, Pass pass) override { engine_.Release(region, pass); }
  float* Gradients(int region) override { return engine_.Gradients(region); }
  void GradientsReady(int region) override;

 private:
  const ParamTable& table_;
  DataParallelEngine& engine_;
  Transformer* model_ = nullptr;
  // Whether the stage's model chunk `chunk` starts with the embedding, or ends with the head.
  bool StartsModel(int chunk) const { return first_ && chunk == 0; }
  bool EndsModel(int chunk) const { return last_ && chunk == head_chunk_; }

  const bool first_;
  const bool last_;
  const int head_chunk_;  // the last of the stage's chunks
  const std::optional<int> tied_region_;
  const int slots_;
  const int b_;
  const int t_;
  const int32_t* inputs_ = nullptr;
  const int32_t* targets_ = nullptr;
  const int32_t* positions_ = nullptr;
  float grad_scale_ = 1.0f;
  int held_head_ready_ = 0;  // the head's GradientsReady calls not yet passed on
  // The Transformer's activation slots: (micro-batch, chunk) in flight -> its slot, and the free.
  std::map<std::pair<int, int>, int> in_flight_;
  std::vector<int> free_slots_;
};

// One step of this stage. `pp` is the pipeline group (rank = stage), `dp` the stage's
// data-parallel group (null without replicas); `next_micro_batch` is
// called for every micro-batch of the step on every stage, so that the stages' data cursors
// stay together; `documents` as TrainStep's. StepResult as TrainStep's, the same on every stage.
absl::StatusOr<StepResult> PipelineTrainStep(Transformer& model, TransformerPipelineStage& stage,
                                             DataParallelEngine& engine, PipelineExecutor& executor,
                                             const ParamTable& table, Communicator& pp,
                                             Communicator* dp, const TrainSection& train, int step,
                                             int micro_batches,
                                             const MicroBatchSource& next_micro_batch,
                                             bool documents = false);

// parallel.check_replicas under a pipeline: GPT-2's tied embedding copies, on the first and
// the last stage, must be bit-identical after the update. Every rank of the stage's
// data-parallel group calls it (the parameters are gathered over it); InternalError naming the
// stages and the count of differing elements otherwise.
absl::Status CheckTiedEmbeddingCopies(DataParallelEngine& engine,
                                      const TransformerPipelineStage& stage,
                                      const ParamTable& table, Communicator& pp);

}  // namespace dtrain
