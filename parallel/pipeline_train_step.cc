#include "parallel/pipeline_train_step.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/util/status.h"
#include "parallel/comm/host_values.h"

namespace dtrain {

int PipelineActivationSlots(const PipelineShape& shape, int stage) {
  return std::min(WarmupForwards(shape, stage) + 1, shape.micro_batches * shape.virtual_stages);
}

namespace {

std::optional<int> TiedRegion(const ParamTable& table, bool first, bool last) {
  if (!table.config().tied_head() || first == last) return std::nullopt;
  return first ? -1 : table.last_region();
}

}  // namespace

TransformerPipelineStage::TransformerPipelineStage(const ParamTable& table,
                                                   DataParallelEngine& engine,
                                                   const PipelineShape& shape, int stage,
                                                   int micro_batch, int seq_len)
    : table_(table),
      engine_(engine),
      first_(stage == 0),
      last_(stage + 1 == shape.stages),
      head_chunk_(shape.virtual_stages - 1),
      tied_region_(TiedRegion(table, first_, last_)),
      slots_(PipelineActivationSlots(shape, stage)),
      b_(micro_batch),
      t_(seq_len) {}

void TransformerPipelineStage::BeginStep(const int32_t* inputs, const int32_t* targets,
                                         const int32_t* positions, float grad_scale) {
  inputs_ = inputs;
  targets_ = targets;
  positions_ = positions;
  grad_scale_ = grad_scale;
  held_head_ready_ = 0;
  in_flight_.clear();
  free_slots_.clear();
  for (int slot = slots_ - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

size_t TransformerPipelineStage::InputCount(int chunk) const {
  return StartsModel(chunk) ? 0 : model_->StageActivationCount(b_, t_);
}
size_t TransformerPipelineStage::OutputCount(int chunk) const {
  return EndsModel(chunk) ? 0 : model_->StageActivationCount(b_, t_);
}

absl::Status TransformerPipelineStage::Forward(int micro_batch, int chunk, ConstValues input,
                                               Values output) {
  if (free_slots_.empty()) {
    return absl::InternalError(absl::StrCat("forward of micro-batch ", micro_batch, " chunk ",
                                            chunk, ": all ", slots_,
                                            " activation slots are in flight; the schedule "
                                            "holds more than PipelineActivationSlots"));
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  in_flight_[{micro_batch, chunk}] = slot;
  const size_t offset = static_cast<size_t>(micro_batch) * b_ * t_;
  Transformer::StageForwardArgs args{.chunk = chunk, .b = b_, .t = t_, .grad_scale = grad_scale_};
  if (StartsModel(chunk)) args.tokens = inputs_ + offset;
  args.input = input;
  if (EndsModel(chunk)) args.targets = targets_ + offset;
  if (positions_ != nullptr) args.positions = positions_ + offset;
  args.output = output;
  model_->StageForward(slot, args);
  return absl::OkStatus();
}

absl::Status TransformerPipelineStage::Backward(int micro_batch, int chunk, ConstValues d_output,
                                                Values d_input) {
  const auto it = in_flight_.find({micro_batch, chunk});
  if (it == in_flight_.end()) {
    return absl::InternalError(absl::StrCat("backward of micro-batch ", micro_batch, " chunk ",
                                            chunk, " before its forward"));
  }
  const int slot = it->second;
  in_flight_.erase(it);
  RETURN_IF_ERROR(engine_.BeginBackward(micro_batch, chunk));
  if (EndsModel(chunk) && held_head_ready_ > 0) {
    --held_head_ready_;
    engine_.GradientsReady(table_.last_region());
  }
  model_->StageBackward(slot, d_output, d_input);
  free_slots_.push_back(slot);
  return absl::OkStatus();
}

void TransformerPipelineStage::GradientsReady(int region) {
  if (region == tied_region_) return;
  if (region == table_.last_region()) {
    ++held_head_ready_;
    return;
  }
  engine_.GradientsReady(region);
}

namespace {

// The other copy of the tied embedding: `count` elements of `own` (backend memory) sent to the
// other end of the pipeline (the first stage's peer is the last, and back), the peer's received.
absl::StatusOr<DeviceBuffer> SwapTiedCopies(Backend& backend, const float* own, size_t count,
                                            Communicator& pp) {
  const int peer = pp.rank() == 0 ? pp.size() - 1 : 0;
  DeviceBuffer other = backend.Allocate(count);
  if (count == 0) return other;
  std::unique_ptr<Work> sent = pp.Send(own, count, peer);
  std::unique_ptr<Work> received = pp.Recv(other.floats(), count, peer);
  const absl::Status receive_status = received->Wait();
  const absl::Status send_status = sent->Wait();
  // Named as the executor names its transfers, so a dead peer is blamed the same way.
  if (!receive_status.ok() || !send_status.ok()) {
    return PipelineFailure(receive_status.ok() ? send_status : receive_status, pp.rank(), pp.size(),
                           &pp, "the tied embedding's gradient", receive_status.ok(), peer);
  }
  return other;
}

size_t TiedOffset(const ParamTable& table, int region) {
  return region == -1 ? table.token_embedding() : table.head();
}

size_t TiedCount(const ParamTable& table) {
  return static_cast<size_t>(table.dims().vocab_rows()) * table.config().d_model;
}

// GPT-2's tied embedding: the first stage's embedding and the last stage's head copy take the
// sum of both gradients, so that the copies, equal at the start, stay bit-identical. The two
// stages (of the same tp rank, so holding the same vocabulary rows) swap their local gradients
// and each adds the other's to its own: a + b == b + a exactly. This runs before the
// data-parallel reduction, which is linear; then the engine is told the region is ready.
// Stages between take no part.
//
// The engine's reduction sums each element over the replicas in an order set by its position
// in its unit, which differs between the two stages' tables. Two replicas' sums commute
// exactly; from three on, the stages would round differently. There the copy is first summed
// over the replicas alone (one buffer, the same positions on both stages), and each replica
// hands the engine S * (1 / dp): the sum of dp equal terms rounds the same in any order.
absl::Status SumTiedEmbeddingGradients(DataParallelEngine& engine,
                                       const TransformerPipelineStage& stage,
                                       const ParamTable& table, Communicator& pp,
                                       Communicator* dp) {
  const std::optional<int> region = stage.tied_region();
  if (!region) return absl::OkStatus();
  float* own =
      engine.Gradients(*region) + (TiedOffset(table, *region) - table.BlockRange(*region).first);
  const size_t count = TiedCount(table);
  Backend& backend = engine.backend();
  ASSIGN_OR_RETURN(const DeviceBuffer other, SwapTiedCopies(backend, own, count, pp));
  backend.Add(own, own, other.floats(), count);
  if (dp != nullptr && dp->size() > 2 && count > 0) {
    RETURN_IF_ERROR(dp->AllReduce(own, count, ReduceOp::kSum)->Wait());
    backend.Scale(own, 1.0f / static_cast<float>(dp->size()), count);
  }
  engine.GradientsReady(*region);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepResult> PipelineTrainStep(Transformer& model, TransformerPipelineStage& stage,
                                             DataParallelEngine& engine, PipelineExecutor& executor,
                                             const ParamTable& table, Communicator& pp,
                                             Communicator* dp, const TrainSection& train, int step,
                                             int micro_batches,
                                             const MicroBatchSource& next_micro_batch,
                                             bool documents) {
  const size_t micro_tokens = static_cast<size_t>(train.micro_batch) * train.seq_len;
  const int64_t global_tokens = static_cast<int64_t>(train.batch_size) * train.seq_len;
  std::vector<int32_t> inputs(micro_tokens * micro_batches), targets(inputs.size());
  std::vector<int32_t> positions(documents ? inputs.size() : 0);
  int32_t* positions_or_null = documents ? positions.data() : nullptr;
  const auto start = std::chrono::steady_clock::now();
  for (int micro = 0; micro < micro_batches; ++micro) {
    const size_t offset = micro * micro_tokens;
    RETURN_IF_ERROR(next_micro_batch(inputs.data() + offset, targets.data() + offset,
                                     documents ? positions.data() + offset : nullptr));
  }
  const double data_wait_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  stage.set_model(&model);
  stage.BeginStep(inputs.data(), targets.data(), positions_or_null,
                  1.0f / static_cast<float>(global_tokens));
  // ZeRO-3 and FSDP gather each unit once per step, not once per micro-batch.
  engine.BeginPipelinedStep(micro_batches, /*keep_gathered=*/true);
  RETURN_IF_ERROR(executor.RunStep(stage));
  RETURN_IF_ERROR(SumTiedEmbeddingGradients(engine, stage, table, pp, dp));
  // The loss is the last stage's; every stage reports it (the engine sums it over dp).
  double loss_sum = model.TakeLossSum();
  double unused = 0;
  RETURN_IF_ERROR(SumOverGroup(&pp, engine.backend(), loss_sum, unused));
  // Every stage read the same targets, so each counts the trained tokens the engine sums over dp.
  ASSIGN_OR_RETURN(StepResult finished,
                   FinishTrainStep(engine, train, step, loss_sum, global_tokens,
                                   documents ? TrainedTokens(targets.data(), targets.size()) : -1));
  finished.data_wait_ms = data_wait_ms;
  return finished;
}

absl::Status CheckTiedEmbeddingCopies(DataParallelEngine& engine,
                                      const TransformerPipelineStage& stage,
                                      const ParamTable& table, Communicator& pp) {
  const std::optional<int> region = stage.tied_region();
  if (!region) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<float> full, engine.GatherParameters());
  const float* own = full.data() + TiedOffset(table, *region);
  const size_t count = TiedCount(table);
  Backend& backend = engine.backend();
  DeviceBuffer staged = backend.Allocate(count);
  backend.CopyFromHost(staged.floats(), own, count * sizeof(float));
  ASSIGN_OR_RETURN(const DeviceBuffer swapped, SwapTiedCopies(backend, staged.floats(), count, pp));
  std::vector<float> other(count);
  backend.CopyToHost(other.data(), swapped.floats(), count * sizeof(float));
  size_t differing = 0;
  for (size_t i = 0; i < count; ++i) differing += own[i] != other[i];
  if (differing == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("the tied embedding's copies on stage 0 (embed.tokens) and stage ",
                   pp.size() - 1, " (the head) differ in ", differing, " of ", count,
                   " elements after the update: their gradients were not summed alike"));
}

}  // namespace dtrain
