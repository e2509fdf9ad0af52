#include "parallel/pipeline_train_step.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/util/status.h"

namespace dtrain {

int PipelineActivationSlots(const PipelineShape& shape, int stage) {
  return std::min(WarmupForwards(shape, stage) + 1, shape.micro_batches * shape.virtual_stages);
}

TransformerPipelineStage::TransformerPipelineStage(const ParamTable& table,
                                                   DataParallelEngine& engine,
                                                   const PipelineShape& shape, int stage,
                                                   int micro_batch, int seq_len)
    : table_(table),
      engine_(engine),
      first_(stage == 0),
      last_(stage + 1 == shape.stages),
      slots_(PipelineActivationSlots(shape, stage)),
      b_(micro_batch),
      t_(seq_len),
      activation_count_(static_cast<size_t>(micro_batch) * seq_len * table.config().d_model) {}

void TransformerPipelineStage::BeginStep(const int32_t* inputs, const int32_t* targets,
                                         float grad_scale) {
  inputs_ = inputs;
  targets_ = targets;
  grad_scale_ = grad_scale;
  loss_sum_ = 0;
  held_head_ready_ = 0;
}

size_t TransformerPipelineStage::InputCount(int) const { return first_ ? 0 : activation_count_; }
size_t TransformerPipelineStage::OutputCount(int) const { return last_ ? 0 : activation_count_; }

absl::Status TransformerPipelineStage::Forward(int micro_batch, int, const float* input,
                                               float* output) {
  const size_t offset = static_cast<size_t>(micro_batch) * b_ * t_;
  Transformer::StageForwardArgs args{.b = b_, .t = t_, .grad_scale = grad_scale_};
  if (first_) args.tokens = inputs_ + offset;
  args.input = input;
  if (last_) args.targets = targets_ + offset;
  args.output = output;
  // In flight micro-batches are consecutive (1F1B: a window of at most slots_; gpipe: all).
  loss_sum_ += model_->StageForward(micro_batch % slots_, args);
  return absl::OkStatus();
}

absl::Status TransformerPipelineStage::Backward(int micro_batch, int, const float* d_output,
                                                float* d_input) {
  RETURN_IF_ERROR(engine_.BeginBackward(micro_batch));
  if (held_head_ready_ > 0) {
    --held_head_ready_;
    engine_.GradientsReady(table_.last_region());
  }
  model_->StageBackward(micro_batch % slots_, d_output, d_input);
  return absl::OkStatus();
}

void TransformerPipelineStage::GradientsReady(int region) {
  if (region == table_.last_region()) {
    ++held_head_ready_;
    return;
  }
  engine_.GradientsReady(region);
}

namespace {

// GPT-2's tied embedding: the first stage's embedding and the last stage's head copy take the
// sum of both gradients, so that the copies, equal at the start, stay equal. The two stages
// swap their gradients and each adds the other's to its own: a + b == b + a exactly, so the
// copies stay bit-identical; the stages between them take no part.
absl::Status SumTiedEmbeddingGradients(DataParallelEngine& engine, const ParamTable& table,
                                       Communicator& pp) {
  const ModelConfig& config = table.config();
  if (!config.tied_head()) return absl::OkStatus();
  const int last_stage = pp.size() - 1;
  float* own = nullptr;
  int peer = 0;
  if (pp.rank() == 0) {
    own = engine.Gradients(-1) + (table.token_embedding() - table.BlockRange(-1).first);
    peer = last_stage;
  } else if (pp.rank() == last_stage) {
    own = engine.Gradients(table.last_region()) +
          (table.head() - table.BlockRange(table.last_region()).first);
  } else {
    return absl::OkStatus();
  }
  const size_t count = static_cast<size_t>(config.vocab_size) * config.d_model;
  std::vector<float> other(count);
  std::unique_ptr<Work> sent = pp.Send(own, count, peer);
  std::unique_ptr<Work> received = pp.Recv(other.data(), count, peer);
  const absl::Status receive_status = received->Wait();
  const absl::Status send_status = sent->Wait();
  RETURN_IF_ERROR(receive_status);
  RETURN_IF_ERROR(send_status);
  for (size_t i = 0; i < count; ++i) own[i] += other[i];
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepResult> PipelineTrainStep(Transformer& model, TransformerPipelineStage& stage,
                                             DataParallelEngine& engine, PipelineExecutor& executor,
                                             const ParamTable& table, Communicator& pp,
                                             const TrainSection& train, int step, int micro_batches,
                                             const MicroBatchSource& next_micro_batch) {
  const size_t micro_tokens = static_cast<size_t>(train.micro_batch) * train.seq_len;
  const int64_t global_tokens = static_cast<int64_t>(train.batch_size) * train.seq_len;
  std::vector<int32_t> inputs(micro_tokens * micro_batches), targets(inputs.size());
  const auto start = std::chrono::steady_clock::now();
  for (int micro = 0; micro < micro_batches; ++micro) {
    RETURN_IF_ERROR(next_micro_batch(inputs.data() + micro * micro_tokens,
                                     targets.data() + micro * micro_tokens));
  }
  const double data_wait_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  stage.set_model(&model);
  stage.BeginStep(inputs.data(), targets.data(), 1.0f / static_cast<float>(global_tokens));
  engine.BeginPipelinedStep(micro_batches, /*keep_gathered=*/false);
  RETURN_IF_ERROR(executor.RunStep(stage));
  RETURN_IF_ERROR(SumTiedEmbeddingGradients(engine, table, pp));
  // The loss is the last stage's; every stage reports it (the engine sums it over dp only).
  double loss_sum = stage.loss_sum();
  double unused = 0;
  RETURN_IF_ERROR(SumOverRanks(&pp, loss_sum, unused));
  ASSIGN_OR_RETURN(StepResult finished,
                   FinishTrainStep(engine, train, step, loss_sum, global_tokens));
  finished.data_wait_ms = data_wait_ms;
  return finished;
}

}  // namespace dtrain
