// The data-parallel engine under a pipeline stage's order of micro-batches: 1F1B's warm-up
// forwards, then forwards and backwards of different micro-batches interleaved. The Transformer
// runs a micro-batch's forward and backward in one call, so the engine is driven with the
// region calls the real model makes (recorded from it on a FlatParameters, split into the
// forward's and the backward's) and the real gradients of each micro-batch, on 2 ranks (threads,
// Gloo).
#include <algorithm>
#include <string>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "core/model/init.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline/schedule.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/flat_parameters.h"
#include "tests/testing/small_model.h"

namespace dtrain {
namespace {

constexpr int kRanks = 2;
constexpr int kMicroBatches = 5;
constexpr int kSeqLen = 8;

struct RegionCall {
  enum Kind { kAcquire, kRelease, kGradients, kGradientsReady } kind;
  int region;
  Pass pass;
};

// The model's BlockParameters calls, on a FlatParameters.
class Recorder : public BlockParameters {
 public:
  explicit Recorder(testing::FlatParameters& flat) : flat_(flat) {}
  ConstValues Acquire(int region, Pass pass) override {
    calls.push_back({RegionCall::kAcquire, region, pass});
    return flat_.Acquire(region, pass);
  }
  void Release(int region, Pass pass) override {
    calls.push_back({RegionCall::kRelease, region, pass});
  }
  float* Gradients(int region) override {
    calls.push_back({RegionCall::kGradients, region, Pass::kBackward});
    return flat_.Gradients(region);
  }
  void GradientsReady(int region) override {
    calls.push_back({RegionCall::kGradientsReady, region, Pass::kBackward});
  }

  std::vector<RegionCall> calls;

 private:
  testing::FlatParameters& flat_;
};

// What one micro-batch does to the parameters, recorded from the real model.
struct ModelRun {
  std::vector<float> params;
  std::vector<RegionCall> forward;                     // up to the first gradient
  std::vector<RegionCall> backward;                    // the rest
  std::vector<std::vector<std::vector<float>>> grads;  // [rank][micro-batch] in table layout
};

ModelRun RunModel(const ModelConfig& config, const ParamTable& table) {
  CpuBackend backend(1);
  testing::FlatParameters flat(table, backend);
  InitParameters(config, table, 7, 0, table.total_numel(), flat.params().data());
  Recorder recorder(flat);
  Transformer model(config, table, recorder, backend, 1, kSeqLen, Recompute::kNone);
  ModelRun run;
  run.params.assign(flat.params().begin(), flat.params().end());
  run.grads.resize(kRanks);
  std::vector<int32_t> inputs(kSeqLen), targets(kSeqLen);
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      for (int i = 0; i < kSeqLen; ++i) {
        inputs[i] = (rank * 37 + micro * 11 + i * 5) % config.vocab_size;
        targets[i] = (rank * 37 + micro * 11 + i * 5 + 3) % config.vocab_size;
      }
      flat.ZeroGradients();
      recorder.calls.clear();
      model.ForwardBackward(inputs.data(), targets.data(), 1, kSeqLen, 1.0f / kSeqLen);
      run.grads[rank].emplace_back(flat.grads().begin(), flat.grads().end());
    }
  }
  const auto first_gradient =
      std::find_if(recorder.calls.begin(), recorder.calls.end(),
                   [](const RegionCall& call) { return call.kind == RegionCall::kGradients; });
  run.forward.assign(recorder.calls.begin(), first_gradient);
  run.backward.assign(first_gradient, recorder.calls.end());
  return run;
}

struct Case {
  std::string strategy;
  ModelFamily family;
  bool keep_gathered;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.strategy << ", " << FamilyName(c.family) << (c.keep_gathered ? ", kept gathered" : "");
}

struct RankResult {
  std::string error;
  int parameter_mismatches = 0;   // Acquire'd values that differ from the model's
  int gradient_mismatches = 0;    // reduced values that differ from the expected sum
  int64_t gradients_checked = 0;  // reduced values compared (the rank's share of the model)
  CommStats step;                 // this step's collectives
  EngineMemory memory;
};

RankResult DriveStage(const Case& c, const ParamTable& table, const ModelRun& run,
                      const std::vector<PipelineAction>& actions, Communicator& comm) {
  ParallelSection parallel;
  parallel.strategy = c.strategy;
  parallel.bucket_mb = 0.01;           // units of a few regions
  parallel.prefetch_bucket_mb = 0.02;  // zero3 units of a few blocks
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(parallel);
  TrainSection train;
  CpuBackend backend(1);
  DataParallelEngine engine(table, strategy, train, backend, &comm);
  engine.LoadParameters(run.params.data());
  RankResult result;
  const std::vector<std::vector<float>>& grads = run.grads[comm.rank()];
  const auto check_params = [&](int region, const float* values) {
    const auto [begin, end] = table.BlockRange(region);
    if (!std::equal(values, values + (end - begin), run.params.begin() + begin)) {
      ++result.parameter_mismatches;
    }
  };
  const auto replay = [&](const std::vector<RegionCall>& calls, int micro) {
    for (const RegionCall& call : calls) {
      switch (call.kind) {
        case RegionCall::kAcquire:
          check_params(call.region, engine.Acquire(call.region, call.pass).as<float>());
          break;
        case RegionCall::kRelease:
          engine.Release(call.region, call.pass);
          break;
        case RegionCall::kGradients:
          engine.Gradients(call.region);
          break;
        case RegionCall::kGradientsReady: {
          // The region's whole contribution, added where the model's last one goes.
          const auto [begin, end] = table.BlockRange(call.region);
          float* g = engine.Gradients(call.region);
          for (size_t i = begin; i < end; ++i) g[i - begin] += grads[micro][i];
          engine.GradientsReady(call.region);
          break;
        }
      }
    }
  };
  const CommStats before = comm.stats();
  engine.BeginPipelinedStep(kMicroBatches, c.keep_gathered);
  std::vector<int> backward_order;
  for (const PipelineAction& action : actions) {
    if (action.kind == PipelineActionKind::kForward) replay(run.forward, action.micro_batch);
    if (action.kind != PipelineActionKind::kBackward) continue;
    if (absl::Status status = engine.BeginBackward(action.micro_batch, action.chunk);
        !status.ok()) {
      result.error = status.ToString();
      return result;
    }
    replay(run.backward, action.micro_batch);
    backward_order.push_back(action.micro_batch);
  }
  // No clipping: the gradient stays the reduced sum.
  absl::StatusOr<StepTotals> totals = engine.FinishStep(0, kSeqLen, 0, 1e-3);
  if (!totals.ok()) {
    result.error = totals.status().ToString();
    return result;
  }
  const CommStats after = comm.stats();
  const auto delta = [](const OpStats& a, const OpStats& b) {
    return OpStats{a.calls - b.calls, a.bytes_sent - b.bytes_sent,
                   a.bytes_received - b.bytes_received};
  };
  result.step.all_reduce = delta(after.all_reduce, before.all_reduce);
  result.step.reduce_scatter = delta(after.reduce_scatter, before.reduce_scatter);
  result.step.all_gather = delta(after.all_gather, before.all_gather);
  // Each rank sums its micro-batches in backward order, from zero, in float as the engine
  // accumulates; the reduction then adds the two ranks' sums once (a + b == b + a exactly), so
  // the comparison is bit for bit. A micro-batch reduced twice, or missed, changes the values.
  std::vector<float> expected(table.total_numel(), 0.0f);
  for (int rank = 0; rank < kRanks; ++rank) {
    std::vector<float> local(table.total_numel(), 0.0f);
    for (const int micro : backward_order) {
      for (size_t i = 0; i < local.size(); ++i) local[i] += run.grads[rank][micro][i];
    }
    for (size_t i = 0; i < local.size(); ++i) expected[i] += local[i];
  }
  for (const GradientSlice& slice : engine.ReducedGradients()) {
    for (size_t i = slice.begin; i < slice.end; ++i) {
      if (slice.values[i - slice.begin] != expected[i]) ++result.gradient_mismatches;
    }
    result.gradients_checked += static_cast<int64_t>(slice.end - slice.begin);
  }
  result.memory = engine.memory();
  return result;
}

class PipelinedEngineTest : public ::testing::TestWithParam<Case> {};

// Stage 0 of a 4-stage 1F1B pipeline over 5 micro-batches: F0 F1 F2 F3 B0 F4 B1 B2 B3 B4. Every
// Acquire hands out the model's parameters; the reduced gradient is the sum over micro-batches
// and ranks exactly once; each unit is reduced once per step (one all-reduce or reduce-scatter
// per unit, plus FinishStep's loss and norm all-reduce) and, kept gathered, gathered once per
// step.
TEST_P(PipelinedEngineTest, ReducesOncePerStepUnderOneFOneB) {
  const Case& c = GetParam();
  const ModelConfig config = testing::SmallModelConfig(c.family);
  const ParamTable table(config, ModelSlice{});
  const ModelRun run = RunModel(config, table);
  absl::StatusOr<std::vector<PipelineAction>> actions = StageActions(
      {.schedule = PipelineSchedule::kOneFOneB, .stages = 4, .micro_batches = kMicroBatches}, 0);
  ASSERT_TRUE(actions.ok()) << actions.status();
  std::vector<RankResult> results(kRanks);
  testing::RunRanksInThreads(kRanks, absl::Seconds(30), [&](Communicator& comm) {
    results[comm.rank()] = DriveStage(c, table, run, *actions, comm);
  });

  ParallelSection parallel;
  parallel.strategy = c.strategy;
  parallel.bucket_mb = 0.01;
  parallel.prefetch_bucket_mb = 0.02;
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(parallel);
  const UnitLayout layout(table, strategy.unit_bytes, kRanks);
  const int64_t units = static_cast<int64_t>(layout.units().size());
  const int64_t block_units = units - 2;  // the embeddings and the head are units of their own
  ASSERT_GT(block_units, 0);
  // Every parameter's gradient was compared: on each rank (replicated), or on one (sharded).
  int64_t checked = 0;
  for (const RankResult& result : results) checked += result.gradients_checked;
  EXPECT_EQ(checked, static_cast<int64_t>(table.total_numel()) *
                         (strategy.sharding == Sharding::kNone ? kRanks : 1));
  for (int rank = 0; rank < kRanks; ++rank) {
    const RankResult& result = results[rank];
    ASSERT_EQ(result.error, "") << "rank " << rank;
    EXPECT_EQ(result.parameter_mismatches, 0) << "rank " << rank;
    EXPECT_EQ(result.gradient_mismatches, 0) << "rank " << rank;
    const CommStats& step = result.step;
    if (strategy.sharding == Sharding::kNone) {
      EXPECT_EQ(step.all_reduce.calls, units + 1) << "rank " << rank;
      EXPECT_EQ(step.reduce_scatter.calls, 0) << "rank " << rank;
      EXPECT_EQ(step.all_gather.calls, 0) << "rank " << rank;
      continue;
    }
    EXPECT_EQ(step.all_reduce.calls, 1) << "rank " << rank;
    EXPECT_EQ(step.reduce_scatter.calls, units) << "rank " << rank;
    if (strategy.sharding != Sharding::kParameters) {
      // The parameters gathered back after the update.
      EXPECT_EQ(step.all_gather.calls, units) << "rank " << rank;
    } else if (c.keep_gathered) {
      EXPECT_EQ(step.all_gather.calls, units) << "rank " << rank;
      // The stage's whole parameters, held together from the warm-up to the last backward.
      EXPECT_EQ(result.memory.gathered_peak_bytes, layout.padded_size() * sizeof(float));
    } else {
      // Each block unit at least in every forward and every backward.
      EXPECT_GE(step.all_gather.calls, 2 * kMicroBatches * block_units) << "rank " << rank;
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    for (const char* strategy : {"ddp", "zero1", "zero2"})
      cases.push_back({strategy, family, false});
    for (const char* strategy : {"zero3", "fsdp"}) {
      cases.push_back({strategy, family, false});
      cases.push_back({strategy, family, true});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Strategies, PipelinedEngineTest, ::testing::ValuesIn(Cases()));

// Announcing a backward twice, or too few, is an error, not a silently wrong reduction.
TEST(PipelinedEngineTest, EveryMicroBatchBackwardIsAnnouncedOnce) {
  const ModelConfig config = testing::SmallModelConfig(ModelFamily::kGpt2);
  const ParamTable table(config, ModelSlice{});
  TrainSection train;
  CpuBackend backend(1);
  DataParallelEngine engine(table, ShardingStrategy{"ddp", Sharding::kNone, 0}, train, backend,
                            nullptr);
  engine.BeginPipelinedStep(2, false);
  ASSERT_TRUE(engine.BeginBackward(0, 0).ok());
  const absl::Status twice = engine.BeginBackward(0, 0);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("already ran"), std::string::npos) << twice;
  EXPECT_EQ(engine.BeginBackward(2, 0).code(), absl::StatusCode::kInvalidArgument);
  // The whole model is one chunk.
  EXPECT_EQ(engine.BeginBackward(1, 1).code(), absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<StepTotals> totals = engine.FinishStep(0, 1, 0, 1e-3);
  EXPECT_EQ(totals.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(totals.status().message().find("1 of its 2"), std::string::npos) << totals.status();
}

// Two model chunks on one engine (stage 0 of an interleaved pipeline of 2 stages: blocks 0 and
// 2): each unit is complete after its own chunk's last backward, which for the later chunk
// comes before the step's last. A unit whose regions are not all ready by then is an error.
TEST(PipelinedEngineTest, EachChunksUnitsCompleteInTheirOwnLastBackward) {
  ModelConfig config = testing::SmallModelConfig(ModelFamily::kLlama);
  config.n_layer = 4;
  const ParamTable table(config, ModelSlice{.chunks = {{0, 1}, {2, 1}}});
  TrainSection train;
  CpuBackend backend(1);
  for (const bool skip_embedding : {false, true}) {
    DataParallelEngine engine(table, ShardingStrategy{"ddp", Sharding::kNone, 0}, train, backend,
                              nullptr);
    engine.BeginPipelinedStep(2, false);
    // Interleaved order: chunk 1's backwards, then chunk 0's.
    for (const int chunk : {1, 0}) {
      for (int micro = 0; micro < 2; ++micro) {
        ASSERT_TRUE(engine.BeginBackward(micro, chunk).ok());
        const std::vector<int> regions = chunk == 1 ? std::vector<int>{2} : std::vector<int>{0, -1};
        for (const int region : regions) {
          if (skip_embedding && region == -1 && micro == 1) continue;
          engine.Gradients(region);
          engine.GradientsReady(region);
        }
      }
    }
    const absl::StatusOr<StepTotals> totals = engine.FinishStep(0, 1, 0, 1e-3);
    if (!skip_embedding) {
      EXPECT_TRUE(totals.ok()) << totals.status();
      continue;
    }
    EXPECT_EQ(totals.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(totals.status().message().find("completed 2 of the stage's 3 units"),
              std::string::npos)
        << totals.status();
  }
}

}  // namespace
}  // namespace dtrain
