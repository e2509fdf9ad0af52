// The planner's estimates against what dtrain's engines actually allocate and send, on 2 ranks
// (threads with Gloo communicators over loopback), in dtrain's CPU precision (fp32).
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/planner/auto_layout.h"
#include "parallel/planner/catalog.h"
#include "parallel/planner/cost_model.h"
#include "parallel/rank_memory.h"
#include "parallel/tensor_parallel.h"
#include "parallel/train_step.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/configs.h"

namespace dtrain {
namespace {

constexpr int kRanks = 2;

Estimate Plan(const Recipe& recipe, Strategy strategy) {
  const Workload workload = WorkloadFromRecipe(recipe, Precision::Trainer(recipe.bf16_params()));
  Layout layout;
  layout.strategy = strategy;
  layout.dp = kRanks;
  layout.micro_batch = recipe.train.micro_batch;
  return EstimateLayout(workload, *ResolveCluster(recipe.cluster), layout);
}

struct Measured {
  EngineMemory memory;
  CommStats comm;
};

// The tokens rank `rank` trains on.
MicroBatchSource Tokens(const ModelConfig& config, const TrainSection& train, int rank) {
  return [&config, &train, rank](int32_t* inputs, int32_t* targets, int32_t*) {
    const size_t n = static_cast<size_t>(train.micro_batch) * train.seq_len;
    for (size_t i = 0; i < n; ++i) {
      inputs[i] = static_cast<int32_t>((i * 7 + rank) % config.vocab_size);
      targets[i] = static_cast<int32_t>((i * 11 + rank) % config.vocab_size);
    }
    return absl::OkStatus();
  };
}

// One engine per rank; with `train_one_step`, one step of random tokens.
std::vector<Measured> Measure(const Recipe& recipe, const std::string& strategy_name,
                              bool train_one_step) {
  ParallelSection parallel = recipe.parallel;
  parallel.strategy = strategy_name;
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(parallel, recipe.bf16_params());
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const TrainSection& train = recipe.train;
  std::vector<Measured> measured(kRanks);
  testing::RunRanksInThreads(kRanks, absl::Seconds(60), [&](Communicator& comm) {
    const int rank = comm.rank();
    const ParamTable table(config, ModelSlice{});
    CpuBackend backend(1);
    DataParallelEngine engine(table, strategy, train, backend, &comm);
    if (train_one_step) {
      engine.InitParameters(config, 1);
      Transformer model(config, table, engine, backend, train.micro_batch, train.seq_len,
                        Recompute::kNone);
      const int micro_batches = train.batch_size / (train.micro_batch * kRanks);
      ASSERT_TRUE(
          TrainStep(model, engine, train, 0, micro_batches, Tokens(config, train, rank)).ok());
    }
    measured[rank] = {engine.memory(), comm.stats()};
  });
  return measured;
}

// Model-state bytes per rank (parameters, gradients, AdamW moments, and at bf16 parameters the
// float32 masters: apart under ddp, zero1 and zero2, the shard itself under zero3) within 10% of
// the plan, for the tiny and the GPT-2 124M recipes. Allocation only: no step is needed.
TEST(PlanVsEngineTest, ModelStateMemoryMatchesThePlan) {
  const std::map<std::string, Strategy> strategies = {{"ddp", Strategy::kDdp},
                                                      {"zero1", Strategy::kZero1},
                                                      {"zero2", Strategy::kZero2},
                                                      {"zero3", Strategy::kZero3}};
  for (const char* config : {"tiny", "gpt2-124m"}) {
    for (const char* precision : {"fp32", "bf16"}) {
      const Recipe recipe =
          testing::ShippedRecipe(config, {absl::StrCat("run.precision=", precision)});
      for (const auto& [name, strategy] : strategies) {
        const double planned = Plan(recipe, strategy).memory.model_state_bytes();
        const double measured = Measure(recipe, name, false)[0].memory.kept();
        EXPECT_NEAR(measured, planned, 0.10 * planned) << config << " " << precision << " " << name;
      }
    }
  }
}

// Bytes one rank put on the wire in one step equal the plan's data-parallel traffic (ring
// all-reduce, reduce-scatter and all-gather), apart from the step's 8-byte loss/norm
// all-reduce, with the gradients reduced in float32 and in bf16, and with float32 and bf16
// parameters (gathered at 2 bytes; auto then reduces in bf16).
TEST(PlanVsEngineTest, CommunicatedBytesMatchThePlan) {
  Recipe recipe = testing::ShippedRecipe("tiny");
  recipe.train.batch_size = 4;
  recipe.train.micro_batch = 2;
  recipe.train.seq_len = 16;
  for (const auto& [precision, reduce_dtype] : std::vector<std::pair<std::string, std::string>>{
           {"fp32", "auto"}, {"fp32", "bf16"}, {"bf16", "auto"}, {"bf16", "fp32"}}) {
    recipe.run.precision = precision;
    recipe.parallel.reduce_dtype = reduce_dtype;
    for (const auto& [name, strategy] : std::map<std::string, Strategy>{
             {"ddp", Strategy::kDdp}, {"zero1", Strategy::kZero1}, {"zero2", Strategy::kZero2}}) {
      const CommStats stats = Measure(recipe, name, true)[0].comm;
      const double sent =
          static_cast<double>(stats.all_reduce.bytes_sent + stats.reduce_scatter.bytes_sent +
                              stats.all_gather.bytes_sent);
      const double planned = Plan(recipe, strategy).dp.sent_bytes;
      EXPECT_NEAR(sent, planned, 64 + 1e-3 * planned)
          << name << ", precision " << precision << ", reduce_dtype " << reduce_dtype;
    }
  }
}

// What the engine held for a moment in one step (gathered parameter units, gradient units and
// their reduced shards, the ddp and zero1 reductions' bf16 copies and shards) stays within the
// start-up check's estimate of it, and near it: every engine, float32 and bf16 parameters (auto
// reduces bf16 ones in bf16), one unit per block (units of 0.5 MB) and all blocks in one.
TEST(PlanVsEngineTest, StepBuffersStayWithinTheStartupEstimate) {
  Recipe recipe = testing::ShippedRecipe("tiny");
  recipe.train.batch_size = 4;
  recipe.train.micro_batch = 2;
  recipe.train.seq_len = 16;
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const auto within = [](size_t measured_bytes, double estimate) {
    const auto measured = static_cast<double>(measured_bytes);
    EXPECT_LE(measured, estimate);
    EXPECT_GE(measured, 0.5 * estimate);
  };
  for (const char* precision : {"fp32", "bf16"}) {
    recipe.run.precision = precision;
    for (const double unit_mb : {0.5, 50.0}) {
      recipe.parallel.bucket_mb = recipe.parallel.prefetch_bucket_mb = unit_mb;
      for (const std::string name : {"ddp", "zero1", "zero2", "zero3"}) {
        SCOPED_TRACE(absl::StrCat(name, ", ", precision, ", units of ", unit_mb, " MB"));
        ParallelSection parallel = recipe.parallel;
        parallel.strategy = name;
        const ShardingStrategy strategy =
            *ShardingStrategyFromRecipe(parallel, recipe.bf16_params());
        const StepBuffers estimate =
            EstimateStepBuffers(ParamTable(config, ModelSlice{}), strategy, kRanks, false);
        const EngineMemory measured = Measure(recipe, name, true)[0].memory;
        EXPECT_EQ(estimate.gathered_bytes > 0, name == "zero3");
        EXPECT_EQ(estimate.gradient_bytes > 0, name == "zero2" || name == "zero3");
        if (estimate.gathered_bytes > 0)
          within(measured.gathered_peak_bytes, estimate.gathered_bytes);
        if (estimate.gradient_bytes > 0) {
          within(measured.gradient_buffer_peak_bytes, estimate.gradient_bytes);
        }
        if (name == "ddp" || name == "zero1") {
          // Nothing but the reductions' copies: none for ddp's float32 all-reduce in place.
          EXPECT_EQ(estimate.wire_bytes > 0, name == "zero1" || std::string(precision) == "bf16");
          if (estimate.wire_bytes > 0) within(measured.reduction_peak_bytes, estimate.wire_bytes);
          EXPECT_EQ(measured.reduction_peak_bytes > 0, estimate.wire_bytes > 0);
        }
      }
    }
  }
}

// A pipelined step holds a stage's every unit until its end (its gathered parameters and
// gradient units, and ddp's and zero1's reductions, which it lands then): the estimate counts all
// of them there, and kUnitsInFlight otherwise.
TEST(PlanVsEngineTest, APipelinedStepHoldsEveryUnitsBuffersToItsEnd) {
  const Recipe recipe = testing::ShippedRecipe("tiny", {"parallel.bucket_mb=0.5"});
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ParamTable table(config, ModelSlice{});
  ParallelSection parallel = recipe.parallel;
  parallel.reduce_dtype = "bf16";
  for (const char* name : {"ddp", "zero1", "zero2"}) {
    SCOPED_TRACE(name);
    parallel.strategy = name;
    const ShardingStrategy strategy = *ShardingStrategyFromRecipe(parallel);
    const UnitLayout units(table, strategy.unit_bytes, std::string(name) == "ddp" ? 1 : kRanks);
    ASSERT_GT(units.units().size(), kUnitsInFlight);
    const StepBuffers pipelined = EstimateStepBuffers(table, strategy, kRanks, true);
    const StepBuffers stepwise = EstimateStepBuffers(table, strategy, kRanks, false);
    EXPECT_GT(pipelined.total_bytes(), stepwise.total_bytes());
    // Every unit's bf16 copy (ddp: the whole gradient, in 2 bytes a value).
    if (std::string(name) == "ddp") {
      EXPECT_DOUBLE_EQ(pipelined.wire_bytes, 2.0 * static_cast<double>(units.padded_size()));
    }
  }
}

// For a data-parallel layout the plan charges a rank what the trainer's start-up check does:
// the same model state, activations and step buffers (EstimateRankMemory; the plan's runtime
// allowance left out), for every engine and precision on 2 and 4 ranks, with the recipe's unit
// sizes (WithRecipeSettings). So a layout the plan fits in a rank's memory passes the check.
TEST(PlanVsEngineTest, ThePlansMemoryIsTheStartupChecks) {
  for (const char* precision : {"fp32", "bf16"}) {
    Recipe recipe = testing::ShippedRecipe(
        "gpt2-124m", {absl::StrCat("run.precision=", precision), "parallel.bucket_mb=10",
                      "parallel.prefetch_bucket_mb=30", "train.micro_batch=2"});
    const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
    const Workload workload = WorkloadFromRecipe(recipe, Precision::Trainer(recipe.bf16_params()));
    const SearchOptions options = WithRecipeSettings(recipe, {});
    for (const auto& [name, strategy] :
         std::map<std::string, Strategy>{{"ddp", Strategy::kDdp},
                                         {"zero1", Strategy::kZero1},
                                         {"zero2", Strategy::kZero2},
                                         {"zero3", Strategy::kZero3},
                                         {"fsdp", Strategy::kFsdp}}) {
      for (const int dp : {2, 4}) {
        SCOPED_TRACE(absl::StrCat(name, ", ", precision, ", dp ", dp));
        const Layout layout{.strategy = strategy, .dp = dp, .micro_batch = 2};
        const MemoryEstimate planned =
            EstimateLayout(workload, *ResolveCluster(recipe.cluster), layout, options.assumptions)
                .memory;
        recipe.parallel.strategy = name;
        const RankMemory checked = EstimateRankMemory(
            recipe, config, *ShardingStrategyFromRecipe(recipe.parallel, recipe.bf16_params()),
            Recompute::kNone, dp);
        EXPECT_NEAR(planned.model_state_bytes(), checked.model_state_bytes(),
                    1e-6 * checked.model_state_bytes());
        EXPECT_DOUBLE_EQ(planned.activation_bytes, checked.activation_bytes);
        EXPECT_DOUBLE_EQ(planned.temporary_bytes, checked.buffer_bytes);
        // None only for ddp's float32 all-reduce in place.
        EXPECT_EQ(checked.buffer_bytes > 0, name != "ddp" || std::string(precision) == "bf16");
      }
    }
  }
}

struct TensorParallelCase {
  std::string config;
  std::vector<std::string> overrides;
  Recompute recompute;
  bool sequence_parallel = false;
};

// Bytes one rank of a tp 2 group (dp 1, threads with Gloo communicators) sent in one step, in
// the tp group and, when kv heads are replicated, in its kv replica group: the f and g
// all-reduces (reduce-scatters and all-gathers under sequence parallelism), the vocabulary's,
// the replicated kv heads' gradient rows and the gradient norm's partial sum.
double MeasureTensorParallelBytes(const Recipe& recipe, Recompute recompute,
                                  bool sequence_parallel) {
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(recipe.parallel);
  const TrainSection& train = recipe.train;
  auto kv_store = std::make_shared<testing::InMemoryStore>();
  std::vector<double> sent(kRanks);
  testing::RunRanksInThreads(kRanks, absl::Seconds(60), [&](Communicator& tp) {
    const int rank = tp.rank();
    const ParamTable table(config, ModelSlice{.tp_rank = rank, .tp_size = kRanks});
    std::unique_ptr<GlooCommunicator> kv;
    const int replicas = table.dims().kv_replicas;
    if (replicas > 1) {
      ASSERT_EQ(replicas, kRanks);  // one kv head: the replica group is the whole tp group
      GlooCommunicatorOptions options{.name = "kv", .rank = rank, .size = replicas};
      options.timeout = absl::Seconds(60);
      auto created = GlooCommunicator::Create(kv_store, options);
      ASSERT_TRUE(created.ok()) << created.status();
      kv = *std::move(created);
    }
    CommTensorParallel ops(tp, kv.get());
    CpuBackend backend(1);
    DataParallelEngine engine(table, strategy, train, backend, nullptr, &tp);
    engine.InitParameters(config, 1);
    Transformer model(config, table, engine, backend, train.micro_batch, train.seq_len, recompute,
                      &ops, sequence_parallel);
    const int micro_batches = train.batch_size / train.micro_batch;
    ASSERT_TRUE(TrainStep(model, engine, train, 0, micro_batches, Tokens(config, train, 0)).ok());
    const absl::Status settled = ops.Settle();
    ASSERT_TRUE(settled.ok()) << settled;
    const CommStats stats = tp.stats();
    EXPECT_EQ(stats.broadcast.calls, 0);
    if (!sequence_parallel) {
      EXPECT_EQ(stats.reduce_scatter.calls + stats.all_gather.calls, 0);
    }
    sent[rank] = static_cast<double>(stats.all_reduce.bytes_sent + stats.reduce_scatter.bytes_sent +
                                     stats.all_gather.bytes_sent) +
                 (kv ? static_cast<double>(kv->stats().all_reduce.bytes_sent) : 0);
  });
  EXPECT_EQ(sent[0], sent[1]);
  return sent[0];
}

// The plan's tensor-parallel traffic is exactly what the model's hooks and the engine send, for
// gpt2 and llama (kv heads split, and one kv head replicated on both ranks), with and without
// full recomputation and sequence parallelism. On 2 ranks a ring all-reduce sends exactly its
// payload, so the payload and the sent bytes are checked at once.
TEST(PlanVsEngineTest, TensorParallelBytesMatchThePlanExactly) {
  const std::vector<TensorParallelCase> cases = {
      {"tiny", {}, Recompute::kNone},
      {"tiny", {}, Recompute::kFull},
      {"llama-tiny", {}, Recompute::kNone},
      {"llama-tiny", {}, Recompute::kFull},
      {"llama-tiny", {"model.n_kv_head=1"}, Recompute::kNone},
      {"tiny", {}, Recompute::kNone, true},
      {"tiny", {}, Recompute::kFull, true},
      {"llama-tiny", {}, Recompute::kNone, true},
      {"llama-tiny", {"model.n_kv_head=1"}, Recompute::kFull, true},
  };
  for (const TensorParallelCase& c : cases) {
    std::vector<std::string> overrides = c.overrides;
    for (const char* small : {"train.batch_size=4", "train.micro_batch=2", "train.seq_len=16"}) {
      overrides.push_back(small);
    }
    const Recipe recipe = testing::ShippedRecipe(c.config, overrides);
    const Workload workload = WorkloadFromRecipe(recipe, Precision::Fp32());
    const Layout layout{.tp = kRanks,
                        .dp = 1,
                        .micro_batch = recipe.train.micro_batch,
                        .recompute = c.recompute,
                        .sequence_parallel = c.sequence_parallel};
    const Estimate planned = EstimateLayout(workload, *ResolveCluster(recipe.cluster), layout);
    const double measured = MeasureTensorParallelBytes(recipe, c.recompute, c.sequence_parallel);
    SCOPED_TRACE(::testing::Message() << c.config << " " << RecomputeName(c.recompute)
                                      << (c.overrides.empty() ? "" : " n_kv_head=1")
                                      << (c.sequence_parallel ? " sp" : ""));
    EXPECT_GT(measured, 0);
    // A reduce-scatter and an all-gather each hand the whole activation to the group (payload)
    // and send half of it on 2 ranks.
    if (!c.sequence_parallel) {
      EXPECT_EQ(measured, planned.tp.payload_bytes);
    }
    EXPECT_EQ(measured, planned.tp.sent_bytes);
  }
}

}  // namespace
}  // namespace dtrain
