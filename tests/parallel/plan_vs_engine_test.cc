// The planner's estimates against what dtrain's engines actually allocate and send, on 2 ranks
// (threads with Gloo communicators over loopback), in dtrain's CPU precision (fp32).
#include <map>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "parallel/data_parallel.h"
#include "parallel/planner/catalog.h"
#include "parallel/planner/cost_model.h"
#include "parallel/train_step.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/configs.h"

namespace dtrain {
namespace {

constexpr int kRanks = 2;

Estimate Plan(const Recipe& recipe, Strategy strategy) {
  Workload workload = WorkloadFromRecipe(recipe);
  workload.precision = Precision::Fp32();
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

// One engine per rank; with `train_one_step`, one step of random tokens.
std::vector<Measured> Measure(const Recipe& recipe, const std::string& strategy_name,
                              bool train_one_step) {
  ParallelSection parallel = recipe.parallel;
  parallel.strategy = strategy_name;
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(parallel);
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
      const MicroBatchSource source = [&](int32_t* inputs, int32_t* targets) {
        const size_t n = static_cast<size_t>(train.micro_batch) * train.seq_len;
        for (size_t i = 0; i < n; ++i) {
          inputs[i] = static_cast<int32_t>((i * 7 + rank) % config.vocab_size);
          targets[i] = static_cast<int32_t>((i * 11 + rank) % config.vocab_size);
        }
        return absl::OkStatus();
      };
      const int micro_batches = train.batch_size / (train.micro_batch * kRanks);
      ASSERT_TRUE(TrainStep(model, engine, train, 0, micro_batches, source).ok());
    }
    measured[rank] = {engine.memory(), comm.stats()};
  });
  return measured;
}

// Model-state bytes per rank (parameters, gradients, AdamW moments) within 10% of the plan,
// for the tiny and the GPT-2 124M recipes. Allocation only: no step is needed.
TEST(PlanVsEngineTest, ModelStateMemoryMatchesThePlan) {
  const std::map<std::string, Strategy> strategies = {{"ddp", Strategy::kDdp},
                                                      {"zero1", Strategy::kZero1},
                                                      {"zero2", Strategy::kZero2},
                                                      {"zero3", Strategy::kZero3}};
  for (const char* config : {"tiny", "gpt2-124m"}) {
    const Recipe recipe = testing::ShippedRecipe(config);
    for (const auto& [name, strategy] : strategies) {
      const double planned = Plan(recipe, strategy).memory.model_state_bytes();
      const double measured = Measure(recipe, name, false)[0].memory.kept();
      EXPECT_NEAR(measured, planned, 0.10 * planned) << config << " " << name;
    }
  }
}

// Bytes one rank put on the wire in one step equal the plan's data-parallel traffic (ring
// all-reduce, reduce-scatter and all-gather), apart from the step's 8-byte loss/norm
// all-reduce.
TEST(PlanVsEngineTest, CommunicatedBytesMatchThePlan) {
  Recipe recipe = testing::ShippedRecipe("tiny");
  recipe.train.batch_size = 4;
  recipe.train.micro_batch = 2;
  recipe.train.seq_len = 16;
  for (const auto& [name, strategy] : std::map<std::string, Strategy>{
           {"ddp", Strategy::kDdp}, {"zero1", Strategy::kZero1}, {"zero2", Strategy::kZero2}}) {
    const CommStats stats = Measure(recipe, name, true)[0].comm;
    const double sent =
        static_cast<double>(stats.all_reduce.bytes_sent + stats.reduce_scatter.bytes_sent +
                            stats.all_gather.bytes_sent);
    const double planned = Plan(recipe, strategy).dp.sent_bytes;
    EXPECT_NEAR(sent, planned, 64 + 1e-3 * planned) << name;
  }
}

}  // namespace
}  // namespace dtrain
