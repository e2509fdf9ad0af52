#include "core/optim/adamw.h"

#include <cmath>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/testing/small_model.h"

namespace dtrain {
namespace {

// With a zero gradient, AdamW only decays: p *= 1 - lr * wd for decayed tensors, unchanged for
// those matching train.no_decay.
TEST(AdamWTest, NoDecayPatternsSelectTensorsByName) {
  const ParamTable table(testing::SmallModelConfig(ModelFamily::kGpt2), ModelSlice{});
  TrainSection train;
  train.weight_decay = 0.5;
  train.no_decay = {"*.bias", "*norm*", "embed.positions"};
  AdamW optimizer(table, train, 0, table.total_numel());
  std::vector<float> params(table.total_numel(), 1.0f), grads(table.total_numel(), 0.0f);
  CpuBackend backend(1);
  optimizer.Step(backend, params.data(), grads.data(), 0.1f);
  for (const TensorEntry& entry : table.entries()) {
    const bool matrix =
        entry.name.ends_with(".weight") && entry.name.find("norm") == std::string::npos;
    const bool decayed = entry.name == "embed.tokens" || matrix;
    const float expected = decayed ? 1.0f - 0.1f * 0.5f : 1.0f;
    // Within 4 ulps: the kernel rounds 1 - lr * wd from double, the test computes it in float.
    EXPECT_FLOAT_EQ(params[entry.offset], expected) << entry.name;
  }
  size_t decayed_numel = 0;
  for (const TensorEntry& entry : table.entries()) {
    if (params[entry.offset] != 1.0f) decayed_numel += entry.numel;
  }
  EXPECT_EQ(optimizer.decayed_numel(), decayed_numel);
}

// A sharded optimizer updates only its own range, and its result there equals the unsharded
// optimizer's.
TEST(AdamWTest, RangeStepMatchesTheWholeBufferStep) {
  const ParamTable table(testing::SmallModelConfig(ModelFamily::kGpt2), ModelSlice{});
  TrainSection train;
  std::vector<float> whole(table.total_numel()), grads(table.total_numel());
  for (size_t i = 0; i < whole.size(); ++i) {
    whole[i] = std::sin(0.1f * i);
    grads[i] = std::cos(0.3f * i);
  }
  std::vector<float> sharded = whole;
  CpuBackend backend(1);
  AdamW full(table, train, 0, table.total_numel());
  const size_t begin = 7, end = table.total_numel() - 5;
  AdamW shard(table, train, begin, end);
  for (int step = 0; step < 3; ++step) {
    full.Step(backend, whole.data(), grads.data(), 1e-2f);
    shard.Step(backend, sharded.data() + begin, grads.data() + begin, 1e-2f);
  }
  for (size_t i = 0; i < whole.size(); ++i) {
    if (i >= begin && i < end) {
      // Bit for bit: every value takes the same instructions wherever the range starts.
      EXPECT_EQ(sharded[i], whole[i]) << i;
    } else {
      EXPECT_EQ(sharded[i], std::sin(0.1f * i)) << i;  // untouched outside the shard
    }
  }
  EXPECT_EQ(shard.m().size(), end - begin);
}

}  // namespace
}  // namespace dtrain
