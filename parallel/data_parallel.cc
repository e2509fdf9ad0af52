#include "parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/model/init.h"
#include "core/util/exit_codes.h"
#include "core/util/fnv.h"
#include "core/util/status.h"
#include "core/util/thread_pool.h"
#include "parallel/comm/host_values.h"

namespace dtrain {
namespace {

uint64_t Fingerprint(const std::vector<uint32_t>& words) {
  uint64_t hash = kFnvOffset;
  for (const uint32_t word : words) hash = FnvMix(hash, word);
  return hash;
}

constexpr size_t kFloat = sizeof(float);

}  // namespace

DataParallelEngine::DataParallelEngine(const ParamTable& table, const ShardingStrategy& strategy,
                                       const TrainSection& train, Backend& backend,
                                       Communicator* comm, Communicator* tensor_parallel,
                                       Communicator* pipeline)
    : table_(table),
      strategy_(strategy),
      backend_(backend),
      comm_(comm),
      tensor_parallel_(tensor_parallel),
      pipeline_(pipeline),
      counted_(table.CountedRanges()),
      layout_(table, strategy.unit_bytes,
              strategy.sharding == Sharding::kNone || comm == nullptr ? 1 : comm->size()) {
  // Sharded, the shard is the float32 masters, gathered into compute copies unit by unit; held
  // whole, the parameters are the compute copies themselves.
  params_ = sharded_params() ? backend_.Allocate(layout_.shard_size())
                             : backend_.Allocate(layout_.padded_size(), compute_type());
  grads_ = backend_.Allocate(sharded_grads() ? layout_.shard_size() : layout_.padded_size());
  if (bf16_params() && !sharded_params()) masters_ = backend_.Allocate(layout_.shard_size());
  scalars_ = backend_.Allocate(3, DataType::kF64);
  const int slice_rank = layout_.ranks() == 1 ? 0 : rank();
  for (const Unit& unit : layout_.units()) {
    const auto [begin, end] = layout_.slice(unit, slice_rank);
    optimizers_.emplace_back(table, train, backend_, begin, std::max(begin, end));
  }
  regions_ready_.assign(layout_.units().size(), 0);
}

size_t DataParallelEngine::OwnOffset(const Unit& unit) const {
  if (sharded_params()) return unit.shard_begin;
  const int slice_rank = layout_.ranks() == 1 ? 0 : rank();
  return unit.padded_begin + slice_rank * unit.shard;
}

float* DataParallelEngine::OwnParams(const Unit& unit) {
  return params_.floats() + OwnOffset(unit);
}

float* DataParallelEngine::LoadedParams() {
  if (params_.dtype() == DataType::kF32) return params_.floats();
  if (loaded_.size() == 0) loaded_ = backend_.Allocate(params_.size());
  return loaded_.floats();
}

float* DataParallelEngine::MasterParams(const Unit& unit) {
  return masters_.size() > 0 ? masters_.floats() + unit.shard_begin : OwnParams(unit);
}

float* DataParallelEngine::OwnGrads(const Unit& unit) {
  if (sharded_grads()) return grads_.floats() + unit.shard_begin;
  const int slice_rank = layout_.ranks() == 1 ? 0 : rank();
  return grads_.floats() + unit.padded_begin + slice_rank * unit.shard;
}

void DataParallelEngine::LoadParameters(const float* full) {
  for (const Unit& unit : layout_.units()) {
    if (sharded_params()) {
      const auto [begin, end] = layout_.slice(unit, rank());
      float* own = OwnParams(unit);
      backend_.Zero(own, unit.shard);
      backend_.CopyFromHost(own, full + begin, (end - begin) * kFloat);
    } else {
      backend_.CopyFromHost(LoadedParams() + unit.padded_begin, full + unit.begin,
                            (unit.end - unit.begin) * kFloat);
    }
  }
  LoadedState();
}

void DataParallelEngine::InitParameters(const ModelConfig& config, uint64_t seed, int threads) {
  // Initialised on the host, one unit's values at a time, then copied into place. Each value is
  // a function of its place alone, so the threads' pieces may be any (a 1B model took 24 s on
  // one thread).
  ThreadPool pool(threads);
  std::vector<float> staged;
  for (const Unit& unit : layout_.units()) {
    const auto [begin, end] =
        sharded_params() ? layout_.slice(unit, rank()) : std::pair{unit.begin, unit.end};
    staged.assign(end - begin, 0.0f);
    pool.ParallelFor(end - begin, size_t{1} << 16, [&](size_t lo, size_t hi, int) {
      dtrain::InitParameters(config, table_, seed, begin + lo, begin + hi, staged.data() + lo);
    });
    float* own = sharded_params() ? OwnParams(unit) : LoadedParams() + unit.padded_begin;
    backend_.CopyFromHost(own, staged.data(), staged.size() * kFloat);
  }
  LoadedState();
}

absl::StatusOr<std::vector<float>> DataParallelEngine::GatherParameters() {
  std::vector<float> full(table_.total_numel());
  DeviceBuffer gathered;
  for (const Unit& unit : layout_.units()) {
    const size_t count = unit.end - unit.begin;
    if (!sharded_params() && masters_.size() == 0) {  // float32 parameters held whole
      backend_.CopyToHost(full.data() + unit.begin, params_.floats() + unit.padded_begin,
                          count * kFloat);
      continue;
    }
    if (gathered.size() < unit.shard * layout_.ranks()) {
      gathered = backend_.Allocate(unit.shard * layout_.ranks());
    }
    std::unique_ptr<Work> work =
        layout_.ranks() > 1 ? comm_->AllGather(MasterParams(unit), gathered.floats(), unit.shard)
                            : nullptr;
    if (!work) backend_.Copy(gathered.floats(), MasterParams(unit), unit.shard * kFloat);
    RETURN_IF_ERROR(Wait(work));
    backend_.CopyToHost(full.data() + unit.begin, gathered.floats(), count * kFloat);
  }
  return full;
}

const float* DataParallelEngine::full_gradients() const {
  return sharded_grads() || comm_ != nullptr ? nullptr : grads_.floats();
}

absl::Status DataParallelEngine::TimedWait(Work& work, bool on_device) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = on_device ? work.WaitOnDevice() : work.Wait();
  exposed_comm_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!status.ok() && error_.ok()) error_ = status;
  return status;
}

absl::Status DataParallelEngine::Wait(std::unique_ptr<Work>& work) {
  if (!work) return absl::OkStatus();
  absl::Status status = TimedWait(*work, /*on_device=*/false);
  work.reset();
  return status;
}

std::unique_ptr<Work> DataParallelEngine::AllReduceGradients(float* grads, size_t count,
                                                             Wire& wire) {
  if (strategy_.reduce_type == DataType::kF32) {
    return comm_->AllReduce(grads, count, ReduceOp::kSum);
  }
  wire.input = backend_.Allocate(count, DataType::kBF16);
  backend_.Convert(wire.input.values(), grads, count);
  return comm_->AllReduce(wire.input.data(), count, DataType::kBF16, ReduceOp::kSum);
}

std::unique_ptr<Work> DataParallelEngine::ReduceScatterGradients(const float* input, float* output,
                                                                 size_t shard, Wire& wire) {
  if (strategy_.reduce_type == DataType::kF32) {
    return comm_->ReduceScatter(input, output, shard, ReduceOp::kSum);
  }
  const size_t count = shard * ranks();
  wire.input = backend_.Allocate(count, DataType::kBF16);
  wire.output = backend_.Allocate(shard, DataType::kBF16);
  backend_.Convert(wire.input.values(), input, count);
  return comm_->ReduceScatter(wire.input.data(), wire.output.data(), shard, DataType::kBF16,
                              ReduceOp::kSum);
}

std::unique_ptr<Work> DataParallelEngine::GatherParams(const float* own, Values output,
                                                       size_t shard, Wire& wire) {
  if (output.dtype() == DataType::kF32) return comm_->AllGather(own, output.as<float>(), shard);
  wire.input = backend_.Allocate(shard, output.dtype());
  backend_.Convert(wire.input.values(), own, shard);
  return comm_->AllGather(wire.input.data(), output.data(), shard, output.dtype());
}

void DataParallelEngine::Land(Wire& wire, float* result, size_t count) {
  const DeviceBuffer& reduced = wire.output.size() > 0 ? wire.output : wire.input;
  if (reduced.size() > 0) {
    backend_.Convert(result, reduced.values(), count);
  }
  wire = Wire{};
}

absl::Status DataParallelEngine::WaitOnDevice(std::unique_ptr<Work>& work) {
  if (!work) return absl::OkStatus();
  absl::Status status = TimedWait(*work, /*on_device=*/true);
  settling_.push_back(std::move(work));
  return status;
}

void DataParallelEngine::Settle() {
  for (std::unique_ptr<Work>& work : settling_) (void)Wait(work);
  settling_.clear();
}

void DataParallelEngine::BeginStep() {
  Settle();  // an evaluation's gathers since the last step
  backend_.Zero(grads_.floats(), grads_.size());
  exposed_comm_ms_ = 0;
  units_completed_ = 0;
  pipelined_ = false;
  keep_gathered_ = false;
}

void DataParallelEngine::BeginPipelinedStep(int micro_batches, bool keep_gathered) {
  BeginStep();
  pipelined_ = true;
  keep_gathered_ = keep_gathered && sharded_params();
  micro_batches_ = std::max(micro_batches, 0);
  const size_t chunks = table_.chunks().size();
  backwards_.assign(micro_batches_ * chunks, false);
  backwards_begun_ = 0;
  chunk_backwards_.assign(chunks, 0);
  // Counted over the whole step: only the last backward's readiness counts.
  std::fill(regions_ready_.begin(), regions_ready_.end(), 0);
}

bool DataParallelEngine::LastBackward(int region) const {
  return pipelined_ ? chunk_backwards_[table_.ChunkOf(region)] == micro_batches_
                    : last_micro_batch_;
}

absl::Status DataParallelEngine::BeginBackward(int micro_batch, int chunk) {
  const int chunks = static_cast<int>(table_.chunks().size());
  if (!pipelined_ || micro_batch < 0 || micro_batch >= micro_batches_ || chunk < 0 ||
      chunk >= chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BeginBackward(", micro_batch, ", ", chunk,
        "): not a micro-batch and chunk of the pipelined step (",
        pipelined_ ? absl::StrCat(micro_batches_, " micro-batches, ", chunks, " chunks")
                   : "BeginPipelinedStep not called",
        ")"));
  }
  const size_t index = static_cast<size_t>(chunk) * micro_batches_ + micro_batch;
  if (backwards_[index]) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeginBackward(", micro_batch, ", ", chunk,
                     "): the backward already ran in this step; each runs once per step"));
  }
  backwards_[index] = true;
  ++chunk_backwards_[chunk];
  const bool last = ++backwards_begun_ == static_cast<int>(backwards_.size());
  if (last && keep_gathered_) {
    // Every forward is done, and backward needs no parameters but the blocks': the embedding's
    // backward reads none, and the final norm's and the head's ran in the last stage's forward.
    // Units of those alone that nobody holds (an untied embedding, a last stage's head) are
    // used no more this step.
    for (auto it = gathered_.begin(); it != gathered_.end();) {
      const Unit& unit = layout_.units()[it->first];
      const bool holds_block = unit.last_region >= 0 && unit.first_region < table_.last_region();
      if (it->second.users > 0 || holds_block) {
        ++it;
        continue;
      }
      (void)Wait(it->second.pending);
      it = gathered_.erase(it);
    }
  }
  return absl::OkStatus();
}

void DataParallelEngine::BeginMicroBatch(bool last) {
  last_micro_batch_ = last;
  std::fill(regions_ready_.begin(), regions_ready_.end(), 0);
}

// ---- parameters -------------------------------------------------------------------------

DataParallelEngine::GatheredUnit& DataParallelEngine::Gather(int unit_index) {
  auto [it, inserted] = gathered_.try_emplace(unit_index);
  GatheredUnit& gathered = it->second;
  if (!inserted) return gathered;
  const Unit& unit = layout_.units()[unit_index];
  gathered.values = backend_.Allocate(unit.shard * ranks(), compute_type());
  if (comm_) {
    gathered.pending =
        GatherParams(OwnParams(unit), gathered.values.values(), unit.shard, gathered.wire);
  } else {
    backend_.Convert(gathered.values.values(), OwnParams(unit), unit.shard);
  }
  size_t live = 0;
  for (const auto& [index, g] : gathered_) live += g.values.size();
  peak_gathered_values_ = std::max(peak_gathered_values_, live);
  return gathered;
}

void DataParallelEngine::Prefetch(int region, Pass pass) {
  const int next = pass == Pass::kForward ? region + 1 : region - 1;
  // Backward ends at block 0: the embedding backward needs no parameters.
  if (next > table_.last_region() || next < 0) return;
  const int next_unit = layout_.unit_index(next);
  if (next_unit >= 0 && next_unit != layout_.unit_index(region)) Gather(next_unit);
}

ConstValues DataParallelEngine::Acquire(int region, Pass pass) {
  const Unit& unit = layout_.unit_of(region);
  const size_t region_begin = table_.BlockRange(region).first;
  if (!sharded_params()) return params_.values() + layout_.padded(unit, region_begin);
  GatheredUnit& gathered = Gather(layout_.unit_index(region));
  (void)WaitOnDevice(gathered.pending);
  gathered.wire = Wire{};  // freed in the compute stream's order, after its wait
  ++gathered.users;
  Prefetch(region, pass);
  return gathered.values.values() + (region_begin - unit.begin);
}

void DataParallelEngine::Release(int region, Pass pass) {
  if (!sharded_params()) return;
  const Unit& unit = layout_.unit_of(region);
  const auto it = gathered_.find(layout_.unit_index(region));
  if (it == gathered_.end()) return;
  const bool leaves_unit =
      pass == Pass::kForward ? region == unit.last_region : region == unit.first_region;
  // Kept for the whole step, a unit is done in its chunk's last backward, where backward leaves
  // it or the head's hold from its forward (the last region, the tied embeddings) ends.
  const bool done = keep_gathered_ ? LastBackward(region) && (pass == Pass::kForward || leaves_unit)
                                   : leaves_unit;
  if (--it->second.users <= 0 && done) {
    (void)Wait(it->second.pending);
    gathered_.erase(it);
  }
}

// ---- gradients --------------------------------------------------------------------------

DataParallelEngine::GradientUnit& DataParallelEngine::GradientBufferFor(int unit_index) {
  for (GradientUnit& buffer : gradient_units_) {
    if (buffer.unit == unit_index && !buffer.pending) return buffer;
  }
  if (gradient_units_.size() >= kUnitsInFlight) {
    // Recycle the oldest buffer already handed to the communicator.
    const auto issued = std::find_if(gradient_units_.begin(), gradient_units_.end(),
                                     [](const GradientUnit& b) { return b.pending != nullptr; });
    if (issued != gradient_units_.end()) {
      (void)Retire(*issued);
      spare_gradient_units_.push_back(std::move(*issued));
      gradient_units_.erase(issued);
    }
  }
  GradientUnit buffer;
  if (!spare_gradient_units_.empty()) {
    buffer = std::move(spare_gradient_units_.back());
    spare_gradient_units_.pop_back();
  }
  const Unit& unit = layout_.units()[unit_index];
  buffer.unit = unit_index;
  buffer.regions_ready = 0;
  // A recycled buffer of the unit's size is reused, zeroed: gradients accumulate into it.
  if (buffer.values.size() != unit.shard * ranks()) {
    buffer.values = backend_.Allocate(unit.shard * ranks());
  } else {
    backend_.Zero(buffer.values.floats(), buffer.values.size());
  }
  if (buffer.reduced.size() != unit.shard) buffer.reduced = backend_.Allocate(unit.shard);
  gradient_units_.push_back(std::move(buffer));
  size_t live = 0;
  for (const GradientUnit& b : gradient_units_) live += b.values.size() + b.reduced.size();
  peak_gradient_unit_values_ = std::max(peak_gradient_unit_values_, live);
  return gradient_units_.back();
}

absl::Status DataParallelEngine::Retire(GradientUnit& buffer) {
  const Unit& unit = layout_.units()[buffer.unit];
  RETURN_IF_ERROR(Wait(buffer.pending));
  Land(buffer.wire, buffer.reduced.floats(), unit.shard);
  float* shard = OwnGrads(unit);
  backend_.Add(shard, shard, buffer.reduced.floats(), unit.shard);
  buffer.unit = -1;
  return absl::OkStatus();
}

float* DataParallelEngine::Gradients(int region) {
  const Unit& unit = layout_.unit_of(region);
  const size_t region_begin = table_.BlockRange(region).first;
  if (!sharded_grads()) return grads_.floats() + layout_.padded(unit, region_begin);
  return GradientBufferFor(layout_.unit_index(region)).values.floats() +
         (region_begin - unit.begin);
}

void DataParallelEngine::GradientsReady(int region) {
  const int unit_index = layout_.unit_index(region);
  const Unit& unit = layout_.units()[unit_index];
  const int regions = unit.last_region - unit.first_region + 1;
  if (!sharded_grads()) {
    // Like DDP's no_sync: micro-batches before the last accumulate locally.
    if (!LastBackward(region) || ++regions_ready_[unit_index] < regions) return;
    ++units_completed_;
    if (!comm_) return;
    PendingReduction reduction{unit_index};
    float* grads = grads_.floats() + unit.padded_begin;
    if (strategy_.sharding == Sharding::kNone) {
      reduction.work = AllReduceGradients(grads, unit.end - unit.begin, reduction.wire);
    } else {
      // ZeRO-1 updates only its slice: a reduce-scatter moves half an all-reduce's bytes. Its
      // output may not be its input (at bf16 it is the wire's).
      if (strategy_.reduce_type == DataType::kF32) reduction.shard = backend_.Allocate(unit.shard);
      reduction.work =
          ReduceScatterGradients(grads, reduction.shard.floats(), unit.shard, reduction.wire);
    }
    // Land the oldest before its copies pile up: one per unit of the model until the step's end
    // (an fp32 all-reduce in place holds none). A pipelined step lands them at its end: a host
    // wait between its chunks' backwards would wait on ranks that wait on this one's sends.
    if (reduction.wire.input.size() > 0 || reduction.shard.size() > 0) {
      size_t live = 0;
      for (const PendingReduction& r : reductions_) live += r.held_bytes();
      if (!pipelined_ && reductions_.size() >= kUnitsInFlight) {
        live -= reductions_.front().held_bytes();
        LandReduction(reductions_.front());
        reductions_.pop_front();
      }
      peak_reduction_bytes_ = std::max(peak_reduction_bytes_, live + reduction.held_bytes());
    }
    reductions_.push_back(std::move(reduction));
    return;
  }
  // A pipelined step's buffers accumulate every backward's contribution until the last one.
  if (pipelined_ && !LastBackward(region)) return;
  GradientUnit& buffer = GradientBufferFor(unit_index);
  if (++buffer.regions_ready < regions) return;
  ++units_completed_;
  if (comm_) {
    buffer.pending = ReduceScatterGradients(buffer.values.floats(), buffer.reduced.floats(),
                                            unit.shard, buffer.wire);
  } else {
    // One rank: its shard is the whole unit.
    backend_.Copy(buffer.reduced.floats(), buffer.values.floats(), unit.shard * kFloat);
    (void)Retire(buffer);
    const auto it = std::find_if(gradient_units_.begin(), gradient_units_.end(),
                                 [&](const GradientUnit& b) { return &b == &buffer; });
    spare_gradient_units_.push_back(std::move(*it));
    gradient_units_.erase(it);
  }
}

void DataParallelEngine::LandReduction(PendingReduction& reduction) {
  if (!WaitOnDevice(reduction.work).ok()) return;  // error_ holds it
  const Unit& unit = layout_.units()[reduction.unit];
  if (strategy_.sharding == Sharding::kNone) {
    Land(reduction.wire, grads_.floats() + unit.padded_begin, unit.end - unit.begin);
  } else if (strategy_.reduce_type == DataType::kF32) {
    backend_.Copy(OwnGrads(unit), reduction.shard.floats(), reduction.shard.bytes());
  } else {
    Land(reduction.wire, OwnGrads(unit), unit.shard);
  }
}

// ---- the end of a step ------------------------------------------------------------------

absl::StatusOr<StepTotals> DataParallelEngine::FinishStep(double local_loss_sum,
                                                          int64_t global_tokens, double grad_clip,
                                                          double lr, int64_t local_trained_tokens) {
  for (PendingReduction& reduction : reductions_) LandReduction(reduction);
  reductions_.clear();
  Settle();
  while (!gradient_units_.empty()) {
    GradientUnit& buffer = gradient_units_.front();
    if (buffer.pending) (void)Retire(buffer);
    spare_gradient_units_.push_back(std::move(buffer));
    gradient_units_.pop_front();
  }
  RETURN_IF_ERROR(error_);
  const bool pipelined = pipelined_;
  // Evaluation between steps gathers and frees as the single-stage path does.
  pipelined_ = keep_gathered_ = false;
  if (pipelined && backwards_begun_ < static_cast<int>(backwards_.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the pipelined step ran ", backwards_begun_, " of its ", backwards_.size(),
                     " backwards (micro-batches x chunks): its gradients are not reduced; call "
                     "BeginBackward before each"));
  }
  if (pipelined && units_completed_ < layout_.units().size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the pipelined step's backwards completed ", units_completed_, " of the stage's ",
        layout_.units().size(),
        " units; the others' regions were not all ready after their chunk's last backward, so "
        "their gradients were never reduced"));
  }

  double sum_squares = CountedSumSquares();
  StepTotals totals;
  // One all-reduce for the loss and the squared norm. Replicated gradients (ddp) are counted
  // once, by rank 0.
  if (layout_.ranks() == 1 && rank() > 0) sum_squares = 0;
  const bool masked = local_trained_tokens >= 0;
  double sums[3] = {local_loss_sum, sum_squares, static_cast<double>(local_trained_tokens)};
  RETURN_IF_ERROR(ReduceStepSums(comm_, absl::MakeSpan(sums, masked ? 3 : 2)));
  local_loss_sum = sums[0];
  sum_squares = sums[1];
  // Token counts are exact in a double up to 2^53.
  totals.trained_tokens = masked ? static_cast<int64_t>(sums[2]) : global_tokens;
  // Backward scaled the gradients by 1 / global_tokens; the step's mean is over the trained
  // tokens.
  const double rescale = totals.trained_tokens > 0 ? static_cast<double>(global_tokens) /
                                                         static_cast<double>(totals.trained_tokens)
                                                   : 1.0;
  // The loss is the same on every tensor-parallel rank (and, summed by the caller, on every
  // stage); the norm's parts are not. Each sum's result is the same on every rank of its group,
  // so the stages then sum equal tp totals, and every rank clips by the same norm.
  for (Communicator* model_parallel : {tensor_parallel_, pipeline_}) {
    RETURN_IF_ERROR(ReduceStepSums(model_parallel, absl::MakeSpan(&sum_squares, 1)));
  }
  totals.loss =
      totals.trained_tokens > 0 ? local_loss_sum / static_cast<double>(totals.trained_tokens) : 0.0;
  totals.grad_norm = std::sqrt(sum_squares) * rescale;
  // The same recipe and data diverge the same way after a restart: exit 2, none.
  if (!std::isfinite(totals.grad_norm) || !std::isfinite(totals.loss)) {
    return WithExitCode(
        absl::InternalError(absl::StrCat(
            "the loss is ", totals.loss, " and the gradient norm ", totals.grad_norm,
            updated_ ? "; lower train.lr (or train.weight_decay), or raise train.warmup_steps"
                     : " before any update, so the weights the run started from give them: "
                       "check model.init_std, or the weights of train.init_from or of the "
                       "checkpoint")),
        kExitUsage);
  }
  // The rule of torch.nn.utils.clip_grad_norm_.
  const double coef = grad_clip > 0 ? grad_clip / (totals.grad_norm + 1e-6) : 1.0;
  // AdamW applies both the rescale to the trained tokens' mean and the clipping as it reads the
  // gradients.
  const float grad_scale = static_cast<float>(rescale * std::min(coef, 1.0));
  // Every rank updated its slices; the whole model is gathered back (ZeRO-1 and -2).
  const bool gather_back = layout_.ranks() > 1 && !sharded_params();
  std::vector<Wire> wires(layout_.units().size());
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    const Unit& unit = layout_.units()[u];
    // With bf16 compute copies beside the masters, AdamW writes the copy as it updates: into the
    // model's copy at one rank, into the wire the gather sends across ranks. (ZeRO-3 and FSDP
    // gather each unit from the masters as they acquire it.)
    Values copy;
    if (masters_.size() > 0 && gather_back) {
      wires[u].input = backend_.Allocate(unit.shard, compute_type());
      copy = wires[u].input.values();
    } else if (masters_.size() > 0) {
      copy = params_.values() + unit.padded_begin;
    }
    optimizers_[u].Step(backend_, MasterParams(unit), copy, OwnGrads(unit), static_cast<float>(lr),
                        grad_scale);
  }
  updated_ = true;

  if (gather_back) {
    std::vector<DeviceBuffer> own(layout_.units().size());
    std::vector<std::unique_ptr<Work>> gathers;
    for (size_t u = 0; u < layout_.units().size(); ++u) {
      const Unit& unit = layout_.units()[u];
      const Values output = params_.values() + unit.padded_begin;
      if (masters_.size() > 0) {  // the copy AdamW wrote into the wire
        gathers.push_back(
            comm_->AllGather(wires[u].input.data(), output.data(), unit.shard, output.dtype()));
        continue;
      }
      // The input may not lie in the output.
      own[u] = backend_.Allocate(unit.shard);
      backend_.Copy(own[u].floats(), OwnParams(unit), unit.shard * kFloat);
      gathers.push_back(comm_->AllGather(own[u].floats(), output.as<float>(), unit.shard));
    }
    for (std::unique_ptr<Work>& gather : gathers) RETURN_IF_ERROR(Wait(gather));
  }
  // The compute stream's waits on the device (Acquire's gathers), timed with events: the norm's
  // read waited for the stream to pass them.
  if (comm_ != nullptr) exposed_comm_ms_ += comm_->TakeDeviceWaitMs();
  totals.exposed_comm_ms = exposed_comm_ms_;
  return totals;
}

double DataParallelEngine::CountedSumSquares() {
  double* sum = static_cast<double*>(scalars_.data());
  ZeroScalar(backend_, sum);
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    const Unit& unit = layout_.units()[u];
    // The gradient slice this rank holds starts where its optimizer slice does.
    const auto [begin, end] = OptimizerRange(u);
    const float* grads = OwnGrads(unit);
    for (const auto& [counted_begin, counted_end] : counted_) {
      const size_t lo = std::max(begin, counted_begin), hi = std::min(end, counted_end);
      if (lo < hi) backend_.SumSquares(grads + (lo - begin), hi - lo, sum);
    }
  }
  return ReadScalar(backend_, sum);
}

absl::Status DataParallelEngine::ReduceStepSums(Communicator* group, absl::Span<double> values) {
  if (group == nullptr) return absl::OkStatus();
  // The group works on backend memory (backend_memory_guard.h).
  backend_.CopyFromHost(scalars_.data(), values.data(), values.size() * sizeof(double));
  std::unique_ptr<Work> work =
      group->AllReduce(static_cast<double*>(scalars_.data()), values.size(), ReduceOp::kSum);
  RETURN_IF_ERROR(Wait(work));
  backend_.CopyToHost(values.data(), scalars_.data(), values.size() * sizeof(double));
  return absl::OkStatus();
}

absl::Status DataParallelEngine::CheckReplicas() {
  if (!comm_ || sharded_params()) return absl::OkStatus();
  std::vector<uint32_t> words((params_.bytes() + sizeof(uint32_t) - 1) / sizeof(uint32_t));
  backend_.CopyToHost(words.data(), params_.data(), params_.bytes());
  const uint64_t fingerprint = Fingerprint(words);
  std::vector<uint64_t> all(ranks());
  RETURN_IF_ERROR(AllGatherHost(*comm_, backend_, &fingerprint, all.data(), 1));
  std::vector<int> differing;
  for (int r = 1; r < ranks(); ++r) {
    if (all[r] != all[0]) differing.push_back(r);
  }
  if (differing.empty()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("parameters of ranks ", absl::StrJoin(differing, ", "),
                   " differ from rank 0's after ", strategy_.name,
                   "'s update: the replicas diverged (non-deterministic kernels or a "
                   "corrupted reduction)"));
}

// ---- checkpoints ------------------------------------------------------------------------

float* DataParallelEngine::ParamAt(const Unit& unit, size_t position) {
  if (!sharded_params()) return LoadedParams() + layout_.padded(unit, position);
  return params_.floats() + unit.shard_begin + (position - layout_.slice(unit, rank()).first);
}

float* DataParallelEngine::MasterAt(size_t u, size_t position) {
  const Unit& unit = layout_.units()[u];
  if (masters_.size() == 0) return ParamAt(unit, position);
  return masters_.floats() + unit.shard_begin + (position - OptimizerRange(u).first);
}

std::pair<size_t, size_t> DataParallelEngine::OptimizerRange(size_t u) const {
  const Unit& unit = layout_.units()[u];
  if (layout_.ranks() == 1) return {unit.begin, unit.end};
  return layout_.slice(unit, rank());
}

std::vector<StateRange> DataParallelEngine::SavedState() {
  std::vector<StateRange> ranges;
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    const Unit& unit = layout_.units()[u];
    // This rank's 1/N share; under sharding exactly its slice.
    const size_t share = (unit.end - unit.begin + ranks() - 1) / ranks();
    const size_t begin = std::min(unit.end, unit.begin + rank() * share);
    const size_t end = std::min(unit.end, begin + share);
    if (begin == end) continue;
    AdamW& optimizer = optimizers_[u];
    const size_t moment_offset = begin - OptimizerRange(u).first;
    ranges.push_back({StateKind::kParameters, begin, end, MasterAt(u, begin)});
    ranges.push_back({StateKind::kMomentM, begin, end, optimizer.m() + moment_offset});
    ranges.push_back({StateKind::kMomentV, begin, end, optimizer.v() + moment_offset});
  }
  return ranges;
}

std::vector<StateRange> DataParallelEngine::HeldState() {
  std::vector<StateRange> ranges;
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    const Unit& unit = layout_.units()[u];
    const auto [param_begin, param_end] =
        sharded_params() ? layout_.slice(unit, rank()) : std::pair{unit.begin, unit.end};
    if (param_begin < param_end) {
      ranges.push_back(
          {StateKind::kParameters, param_begin, param_end, ParamAt(unit, param_begin)});
    }
    const auto [begin, end] = OptimizerRange(u);
    if (begin >= end) continue;
    ranges.push_back({StateKind::kMomentM, begin, end, optimizers_[u].m()});
    ranges.push_back({StateKind::kMomentV, begin, end, optimizers_[u].v()});
  }
  return ranges;
}

void DataParallelEngine::LoadedState() {
  if (!bf16_params() || sharded_params()) return;  // a shard is rounded as it is gathered
  const float* loaded = LoadedParams();
  for (const Unit& unit : layout_.units()) {
    backend_.Copy(MasterParams(unit), loaded + OwnOffset(unit), unit.shard * kFloat);
    backend_.Convert(params_.values() + unit.padded_begin, loaded + unit.padded_begin,
                     unit.shard * layout_.ranks());
  }
  loaded_.Reset();
}

std::vector<GradientSlice> DataParallelEngine::ReducedGradients() {
  std::vector<GradientSlice> slices;
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    const auto [begin, end] = OptimizerRange(u);
    if (begin < end) slices.push_back({begin, end, OwnGrads(layout_.units()[u])});
  }
  return slices;
}

void DataParallelEngine::SetOptimizerStep(int64_t step) {
  for (AdamW& optimizer : optimizers_) optimizer.set_step(step);
}

EngineMemory DataParallelEngine::memory() const {
  EngineMemory memory;
  memory.parameter_bytes = params_.bytes();
  memory.optimizer_bytes = masters_.bytes();  // with the moments: the ZeRO paper's K
  memory.gradient_bytes = grads_.bytes();
  memory.gathered_peak_bytes = peak_gathered_values_ * DataTypeBytes(compute_type());
  memory.gradient_buffer_peak_bytes = peak_gradient_unit_values_ * sizeof(float);
  memory.reduction_peak_bytes = peak_reduction_bytes_;
  for (const AdamW& optimizer : optimizers_) {
    memory.optimizer_bytes += 2 * optimizer.numel() * sizeof(float);
  }
  return memory;
}

}  // namespace dtrain
