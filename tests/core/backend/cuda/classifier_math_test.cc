#include "core/backend/cuda/classifier_math.h"

#include <cstdint>
#include <vector>

#include "core/backend/cpu/classifier.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectFloatMatches;
using testing::ExpectMatches;
using testing::HostWarp;
using testing::Load;
using testing::RunOnHostWarp;
using testing::Store;

constexpr float kGradScale = 0.25f;

// The CPU backend's fused classifier on logits (N, V) given directly: with x = the logits and
// weight = the V x V identity, its GEMMs are exact, logits = x and dx = dlogits. Called one row
// at a time for each row's loss.
void CpuClassifier(const std::vector<float>& logits, const std::vector<int32_t>& targets, int v,
                   std::vector<float>* losses, std::vector<float>* dlogits) {
  const int n = static_cast<int>(targets.size());
  std::vector<float> identity(static_cast<size_t>(v) * v, 0.0f), dweight(identity.size());
  for (int j = 0; j < v; ++j) identity[static_cast<size_t>(j) * v + j] = 1.0f;
  std::vector<float> scratch(cpu::ClassifierScratchSize(1, v));
  losses->resize(n);
  dlogits->resize(logits.size());
  for (int row = 0; row < n; ++row) {
    const size_t at = static_cast<size_t>(row) * v;
    (*losses)[row] = static_cast<float>(cpu::ClassifierForwardBackward(
        dlogits->data() + at, dweight.data(), logits.data() + at, identity.data(), &targets[row], 1,
        v, v, kGradScale, 1, scratch.data(), nullptr));
  }
}

// Rows of v logits whose targets include an ignored row (-1), the first and the last column;
// the last row's logits sit near 60, where exp without the max shift would overflow.
template <typename T>
void CheckClassifier(int v) {
  SCOPED_TRACE(::testing::Message() << "v " << v);
  const std::vector<int32_t> targets = {3 % v, -1, 0, v - 1, v / 2};
  const int n = static_cast<int>(targets.size());
  std::vector<float> values = testing::RandomFloats(n * v, 1, -4, 4);
  for (int j = 0; j < v; ++j) values[static_cast<size_t>(n - 1) * v + j] += 60.0f;
  std::vector<T> logits = Store<T>(values);
  const std::vector<float> stored = Load(logits);

  std::vector<float> losses(n), losses_no_gradient(n);
  std::vector<T> untouched = logits;
  for (int row = 0; row < n; ++row) {
    const size_t at = static_cast<size_t>(row) * v;
    RunOnHostWarp([&](const HostWarp& warp) {
      ClassifierRow(warp, logits.data() + at, &losses[row], targets[row], v, kGradScale, true);
    });
    RunOnHostWarp([&](const HostWarp& warp) {
      ClassifierRow(warp, untouched.data() + at, &losses_no_gradient[row], targets[row], v,
                    kGradScale, false);
    });
  }
  std::vector<float> losses_cpu, dlogits_cpu;
  CpuClassifier(stored, targets, v, &losses_cpu, &dlogits_cpu);
  ExpectFloatMatches(losses, losses_cpu, "loss");
  ExpectMatches(logits, dlogits_cpu, "dlogits");
  ExpectFloatMatches(losses_no_gradient, losses_cpu, "loss without gradient");
  EXPECT_EQ(Load(untouched), stored) << "the logits stay when no gradient is asked for";
}

// 20: lanes 20-31 see no logit; 100 and 128: three or four a lane, with online rescaling.
TEST(CudaClassifierTest, Fp32MatchesCpuBackend) {
  for (int v : {20, 100, 128}) CheckClassifier<float>(v);
}

TEST(CudaClassifierTest, Bf16MatchesCpuBackendOnRoundedInputs) {
  for (int v : {20, 100, 128}) CheckClassifier<Bf16>(v);
}

}  // namespace
}  // namespace dtrain::cuda
