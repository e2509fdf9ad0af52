// The transformer's pipeline stage passes (Transformer::StageForward / StageBackward) run in a
// schedule's order: one process holds every stage, runs each stage's actions from StageActions
// and hands activations and gradients from stage to stage by copying buffers, as the executor's
// sends and receives will.
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/model/init.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_assignment.h"
#include "tests/testing/flat_parameters.h"
#include "tests/testing/small_model.h"
#include "tests/testing/tensor_parallel_ranks.h"

namespace dtrain {
namespace {

constexpr int kBatch = 2, kTime = 7, kMicroBatches = 5;
constexpr uint64_t kSeed = 21;
constexpr float kGradScale = 1.0f / (kMicroBatches * kBatch * kTime);

std::vector<int32_t> Tokens(int vocab, int salt) {
  return testing::PatternTokens(kBatch * kTime, vocab, salt);
}

// A model (whole or one stage) with its own parameters: the seed's init, with biases and norm
// weights moved off 0 and 1 by global index, so that a stage reading another region's norm would
// show.
struct StageModel {
  StageModel(const ModelConfig& config, const ModelSlice& slice, Backend& backend,
             Recompute recompute, int slots, TensorParallelOps* ops = nullptr,
             bool sequence_parallel = false)
      : table(config, slice),
        parameters(table, backend),
        model(config, table, parameters, backend, kBatch, kTime, recompute, ops, sequence_parallel,
              slots) {
    testing::InitDistinctParameters(config, table, kSeed, parameters.params().data());
    // The memory check's estimate is what the stage allocates.
    EXPECT_EQ(Transformer::ActivationBytes(config, kBatch, kTime, recompute, slice,
                                           sequence_parallel, slots),
              static_cast<double>(model.activation_bytes()));
  }
  ParamTable table;
  testing::FlatParameters parameters;
  Transformer model;
};

// The micro-batches of one step.
struct Batches {
  explicit Batches(int vocab) {
    for (int m = 0; m < kMicroBatches; ++m) {
      inputs.push_back(Tokens(vocab, 2 * m));
      targets.push_back(Tokens(vocab, 2 * m + 1));
    }
    targets[1][3] = -1;  // an ignored target
  }
  std::vector<std::vector<int32_t>> inputs, targets;
};

// The whole model, micro-batch after micro-batch: returns the loss sum.
double TrainWholeModel(StageModel& whole, const Batches& batches) {
  double loss = 0;
  for (int m = 0; m < kMicroBatches; ++m) {
    loss += testing::ForwardBackwardLoss(whole.model, batches.inputs[m].data(),
                                         batches.targets[m].data(), kBatch, kTime, kGradScale);
  }
  return loss;
}

// Every stage of one tensor-parallel rank's pipeline (blocks balanced by AssignStages), run in
// one thread in the schedule's order.
struct Pipeline {
  Pipeline(const ModelConfig& config, const PipelineShape& shape, Backend& backend,
           Recompute recompute, const ModelSlice& tp_slice = {}, TensorParallelOps* ops = nullptr,
           bool sequence_parallel = false)
      : shape(shape) {
    PipelineCosts costs;
    costs.blocks.assign(config.n_layer, 1.0);
    const auto assignment = AssignStages(costs, shape.stages, 1);
    EXPECT_TRUE(assignment.ok()) << assignment.status();
    const int64_t tokens = kBatch * kTime;
    const int tp = sequence_parallel ? tp_slice.tp_size : 1;
    rows = static_cast<size_t>((tokens + tp - 1) / tp) * config.d_model;
    for (int s = 0; s < shape.stages; ++s) {
      // Under 1F1B a stage holds at most warm-up + 1 micro-batches (schedule.h), GPipe all:
      // that many slots suffice.
      const int slots = std::min(kMicroBatches, WarmupForwards(shape, s) + 1);
      occupant.emplace_back(slots, -1);
      ModelSlice slice = tp_slice;
      slice.chunks = StageChunks(*assignment, s);
      stages.push_back(std::make_unique<StageModel>(config, slice, backend, recompute, slots, ops,
                                                    sequence_parallel));
      auto list = StageActions(shape, s);
      EXPECT_TRUE(list.ok()) << list.status();
      actions.push_back(list.ok() ? *std::move(list) : std::vector<PipelineAction>{});
    }
  }

  // One step, the executor's contract one action at a time: a compute waits for what it needs
  // (the previous stage's activation, the next stage's gradient), sends deliver into the peer's
  // mailbox in order, receives need nothing here. Slot = micro-batch mod slots: micro-batches
  // finish in the order they start, so the slot is free (checked). Adds the loss sum to *loss.
  void Run(const Batches& batches, double* loss) {
    const int p = shape.stages;
    std::vector<std::deque<std::vector<float>>> activations(p), gradients(p);
    std::vector<std::map<int, std::vector<float>>> outputs(p), input_grads(p);
    std::vector<size_t> next(p, 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < p; ++s) {
        Transformer& model = stages[s]->model;
        const bool first = s == 0, last = s + 1 == p;
        while (next[s] < actions[s].size()) {
          const PipelineAction& action = actions[s][next[s]];
          const int mb = action.micro_batch;
          const int slot = mb % static_cast<int>(occupant[s].size());
          if (action.kind == PipelineActionKind::kForward) {
            if (!first && activations[s].empty()) break;
            ASSERT_EQ(occupant[s][slot], -1) << "stage " << s << " micro-batch " << mb;
            occupant[s][slot] = mb;
            std::vector<float> input;
            if (!first) {
              input = std::move(activations[s].front());
              activations[s].pop_front();
            }
            std::vector<float>& output = outputs[s][mb];
            output.assign(last ? 0 : rows, 0.0f);
            model.StageForward(slot, {.b = kBatch,
                                      .t = kTime,
                                      .tokens = first ? batches.inputs[mb].data() : nullptr,
                                      .input = first ? nullptr : input.data(),
                                      .targets = last ? batches.targets[mb].data() : nullptr,
                                      .grad_scale = kGradScale,
                                      .output = last ? nullptr : output.data()});
          } else if (action.kind == PipelineActionKind::kBackward) {
            if (!last && gradients[s].empty()) break;
            ASSERT_EQ(occupant[s][slot], mb) << "stage " << s;
            occupant[s][slot] = -1;
            std::vector<float> d_output;
            if (!last) {
              d_output = std::move(gradients[s].front());
              gradients[s].pop_front();
            }
            std::vector<float>& d_input = input_grads[s][mb];
            d_input.assign(first ? 0 : rows, 0.0f);
            model.StageBackward(slot, last ? nullptr : d_output.data(),
                                first ? nullptr : d_input.data());
          } else if (action.kind == PipelineActionKind::kSendForward) {
            activations[action.peer].push_back(std::move(outputs[s].at(mb)));
            outputs[s].erase(mb);
          } else if (action.kind == PipelineActionKind::kSendBackward) {
            gradients[action.peer].push_back(std::move(input_grads[s].at(mb)));
            input_grads[s].erase(mb);
          }
          ++next[s];
          progress = true;
        }
      }
    }
    for (int s = 0; s < p; ++s) {
      ASSERT_EQ(next[s], actions[s].size()) << "stage " << s;
      *loss += stages[s]->model.TakeLossSum();  // 0 but on the last stage
    }
  }

  PipelineShape shape;
  size_t rows = 0;  // floats of one activation (R, C)
  std::vector<std::unique_ptr<StageModel>> stages;
  std::vector<std::vector<PipelineAction>> actions;
  std::vector<std::vector<int>> occupant;  // per stage and slot: its micro-batch or -1
};

// Every gradient of the pipeline's stages is the whole model's (within `tolerance` of the
// whole model's largest gradient; 0: bit for bit), GPT-2's tied embedding as the sum of the
// first stage's and the last stage's copy.
void ExpectWholeModelGradients(const StageModel& whole, const Pipeline& pipeline, double tolerance,
                               double tied_tolerance) {
  const auto reference = whole.parameters.grads();
  float max_abs = 0;
  for (float g : reference) max_abs = std::max(max_abs, std::abs(g));
  ASSERT_GT(max_abs, 0);
  // The last stage's tied head copy (GPT-2), whose rows are those of the first stage's
  // embedding on the same tensor-parallel rank.
  const StageModel& last = *pipeline.stages.back();
  const float* copy = nullptr;
  for (const TensorEntry& entry : last.table.entries()) {
    if (last.table.IsTiedHeadCopy(entry)) copy = last.parameters.grads().data() + entry.offset;
  }
  for (const auto& stage : pipeline.stages) {
    const ParamTable& table = stage->table;
    const auto grads = stage->parameters.grads();
    for (const TensorEntry& entry : table.entries()) {
      if (table.IsTiedHeadCopy(entry)) continue;
      const TensorEntry& global = *whole.table.Find(entry.name);
      const bool tied = copy != nullptr && entry.name == "embed.tokens";
      const double bound = (tied ? tied_tolerance : tolerance) * max_abs;
      ForEachGlobalRun(entry, 0, entry.numel, [&](size_t local, size_t g, size_t count) {
        for (size_t i = 0; i < count; ++i) {
          const float value = grads[entry.offset + local + i] + (tied ? copy[local + i] : 0.0f);
          const float expected = reference[global.offset + g + i];
          if (bound == 0) {
            ASSERT_EQ(value, expected) << entry.name << " local " << local + i;
          } else {
            ASSERT_NEAR(value, expected, bound) << entry.name << " local " << local + i;
          }
        }
      });
    }
  }
}

struct Case {
  ModelFamily family;
  int stages;
  Recompute recompute;
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
};

class StagePassesTest : public ::testing::TestWithParam<Case> {};

// The tied gradient is the same terms (per micro-batch, the head's GEMM and each token's
// embedding row: K <= m (1 + b t) = 75 of them) summed in another grouping. Two orders differ by
// at most 2 K u sum|terms|, u = 2^-24 (Higham 4.2), about 1e-5 of the terms' magnitudes, which
// at init are of the order of the largest gradient: 1e-5 of it (1e-7 seen).
constexpr double kTiedTolerance = 1e-5;

// Stages of contiguous blocks, each holding the activations of as many micro-batches as its
// schedule keeps in flight, give the whole model's loss and gradients: every tensor's gradient
// bit for bit (each region accumulates the same micro-batches' contributions, computed by the
// same kernels on the same values, in the same order), except GPT-2's tied embedding, whose
// gradient the whole model accumulates in one buffer and the stages in two (the first stage's
// embedding, the last stage's head copy), summed at the end.
TEST_P(StagePassesTest, StagesGiveTheWholeModelsLossAndGradients) {
  const Case c = GetParam();
  const ModelConfig config = testing::SmallModelConfig(c.family);  // 3 blocks
  CpuBackend backend(1);
  const Batches batches(config.vocab_size);
  StageModel whole(config, ModelSlice{}, backend, c.recompute, 1);
  const double reference_loss = TrainWholeModel(whole, batches);

  Pipeline pipeline(config,
                    {.schedule = c.schedule, .stages = c.stages, .micro_batches = kMicroBatches},
                    backend, c.recompute);
  double loss = 0;
  pipeline.Run(batches, &loss);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(loss, reference_loss);
  ExpectWholeModelGradients(whole, pipeline, 0, kTiedTolerance);
}

// Evaluation's pass (StageForwardLoss) through the stages in turn is the whole model's
// ForwardLoss bit for bit (the same kernels on the same values), and touches no gradient.
TEST_P(StagePassesTest, ForwardLossThroughTheStagesIsTheWholeModels) {
  const Case c = GetParam();
  const ModelConfig config = testing::SmallModelConfig(c.family);
  CpuBackend backend(1);
  const Batches batches(config.vocab_size);
  StageModel whole(config, ModelSlice{}, backend, c.recompute, 1);
  const double reference =
      whole.model.ForwardLoss(batches.inputs[1].data(), batches.targets[1].data(), kBatch, kTime);

  Pipeline pipeline(config,
                    {.schedule = c.schedule, .stages = c.stages, .micro_batches = kMicroBatches},
                    backend, c.recompute);
  std::vector<float> input(pipeline.rows), output(pipeline.rows);
  double loss = 0;
  for (int s = 0; s < c.stages; ++s) {
    const bool first = s == 0, last = s + 1 == c.stages;
    loss += pipeline.stages[s]->model.StageForwardLoss(
        {.b = kBatch,
         .t = kTime,
         .tokens = first ? batches.inputs[1].data() : nullptr,
         .input = first ? nullptr : input.data(),
         .targets = last ? batches.targets[1].data() : nullptr,
         .output = last ? nullptr : output.data()});
    std::swap(input, output);
  }
  EXPECT_EQ(loss, reference);
  for (const auto& stage : pipeline.stages) {
    const auto grads = stage->parameters.grads();
    EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.0f; }));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Splits, StagePassesTest,
    ::testing::Values(Case{ModelFamily::kGpt2, 2, Recompute::kNone},
                      Case{ModelFamily::kGpt2, 3, Recompute::kSelective},
                      Case{ModelFamily::kGpt2, 3, Recompute::kFull},
                      Case{ModelFamily::kGpt2, 2, Recompute::kNone, PipelineSchedule::kGpipe},
                      Case{ModelFamily::kLlama, 2, Recompute::kSelective},
                      Case{ModelFamily::kLlama, 2, Recompute::kFull},
                      Case{ModelFamily::kLlama, 3, Recompute::kNone},
                      Case{ModelFamily::kLlama, 3, Recompute::kFull, PipelineSchedule::kGpipe}),
    [](const auto& info) {
      return absl::StrCat(FamilyName(info.param.family), "_pp", info.param.stages, "_",
                          RecomputeName(info.param.recompute), "_",
                          PipelineScheduleName(info.param.schedule));
    });

struct TensorParallelCase {
  ModelFamily family;
  int stages;
  Recompute recompute;
  bool sequence_parallel;
};

class StagePassesTensorParallelTest : public ::testing::TestWithParam<TensorParallelCase> {};

// Tensor parallelism (tp 2, with and without sequence parallelism) inside each stage: each
// tensor-parallel rank is a thread running its stages in the schedule's order; its stages share
// its communicator, since both ranks issue their stages' collectives in the same order.
// Tolerance: that of tensor_parallel_test.cc (the same sums of float products in another order,
// 1e-5 of the largest gradient; the loss to 1e-6 of itself).
TEST_P(StagePassesTensorParallelTest, TensorParallelStagesGiveTheWholeModelsLossAndGradients) {
  const TensorParallelCase c = GetParam();
  const ModelConfig config = testing::SmallModelConfig(c.family);
  CpuBackend backend(1);
  const Batches batches(config.vocab_size);
  StageModel whole(config, ModelSlice{}, backend, c.recompute, 1);
  const double reference_loss = TrainWholeModel(whole, batches);
  const PipelineShape shape{.stages = c.stages, .micro_batches = kMicroBatches};
  testing::RunTensorParallelRanks(
      config, 2, [&](const ParamTable& table, TensorParallelOps* ops, const Communicator&) {
        CpuBackend rank_backend(1);
        Pipeline pipeline(config, shape, rank_backend, c.recompute, table.slice(), ops,
                          c.sequence_parallel);
        double loss = 0;
        pipeline.Run(batches, &loss);
        EXPECT_NEAR(loss, reference_loss, 1e-6 * reference_loss);
        ExpectWholeModelGradients(whole, pipeline, 1e-5, 1e-5);
      });
}

INSTANTIATE_TEST_SUITE_P(
    Splits, StagePassesTensorParallelTest,
    ::testing::Values(TensorParallelCase{ModelFamily::kGpt2, 2, Recompute::kNone, false},
                      TensorParallelCase{ModelFamily::kGpt2, 3, Recompute::kFull, true},
                      TensorParallelCase{ModelFamily::kLlama, 3, Recompute::kSelective, true},
                      TensorParallelCase{ModelFamily::kLlama, 2, Recompute::kNone, false}),
    [](const auto& info) {
      return absl::StrCat(FamilyName(info.param.family), "_pp", info.param.stages, "_tp2_",
                          RecomputeName(info.param.recompute),
                          info.param.sequence_parallel ? "_sp" : "");
    });

}  // namespace
}  // namespace dtrain
