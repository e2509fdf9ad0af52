#include "core/backend/cuda/classifier_math.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/backend/cpu/classifier.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectFloatMatches;
using testing::ExpectMatches;
using testing::HostBlock;
using testing::Load;
using testing::RunOnHostBlock;
using testing::Store;

constexpr float kGradScale = 0.25f;
constexpr int kThreads = kClassifierThreads;
using Block = HostBlock<kThreads>;

// Runs body(block, shared) on each thread of one emulated block of kBlockThreads threads (the
// kernels' kThreads unless a test asks for more packs a thread), shared being the block's
// kBlockThreads / kWarpSize values of type V.
template <typename V, int kBlockThreads = kThreads, typename Body>
void RunOnClassifierBlock(const Body& body) {
  std::vector<V> shared(kBlockThreads / kWarpSize);
  RunOnHostBlock<kBlockThreads>(
      [&](const HostBlock<kBlockThreads>& block) { body(block, shared.data()); });
}

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
// the last row's logits sit near 60, where exp without the max shift would overflow. On blocks
// of kBlockThreads.
template <typename T, int kBlockThreads = kThreads>
void CheckClassifier(int v) {
  SCOPED_TRACE(::testing::Message() << "v " << v << " on " << kBlockThreads << " threads");
  using BlockHere = HostBlock<kBlockThreads>;
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
    RunOnClassifierBlock<SoftmaxState, kBlockThreads>(
        [&](const BlockHere& block, SoftmaxState* shared) {
          ClassifierRow<kBlockThreads>(block, shared, logits.data() + at, &losses[row],
                                       targets[row], v, kGradScale, true);
        });
    RunOnClassifierBlock<SoftmaxState, kBlockThreads>([&](const BlockHere& block,
                                                          SoftmaxState* shared) {
      ClassifierRow<kBlockThreads>(block, shared, untouched.data() + at, &losses_no_gradient[row],
                                   targets[row], v, kGradScale, false);
    });
  }
  std::vector<float> losses_cpu, dlogits_cpu;
  CpuClassifier(stored, targets, v, &losses_cpu, &dlogits_cpu);
  ExpectFloatMatches(losses, losses_cpu, "loss");
  ExpectMatches(logits, dlogits_cpu, "dlogits");
  ExpectFloatMatches(losses_no_gradient, losses_cpu, "loss without gradient");
  EXPECT_EQ(Load(untouched), stored) << "the logits stay when no gradient is asked for";
}

// 20 and 100: most threads see no logit, and a row's last pack is part of one; 2053: one to three
// packs a thread of the kernels' 256 (1,024 values a pass over the block in fp32, 2,048 in bf16),
// and on one warp 8 to 17, as GPT-2's 50,257 logits give the kernels' threads 25 in bf16, with
// online rescaling. Rows that start off the 16-byte boundaries (bf16 rows of 20 and 100, every
// row but the first of 2053) begin inside their first pack.
TEST(CudaClassifierTest, Fp32MatchesCpuBackend) {
  for (int v : {20, 100, 128, 2053}) CheckClassifier<float>(v);
  CheckClassifier<float, kWarpSize>(2053);
}

TEST(CudaClassifierTest, Bf16MatchesCpuBackendOnRoundedInputs) {
  for (int v : {20, 100, 128, 2053}) CheckClassifier<Bf16>(v);
  CheckClassifier<Bf16, kWarpSize>(2053);
}

// The vocabulary-parallel phases on one rank's slice of V = 100 logits per row, as the model
// runs them (the max and the sums taken as this rank's alone, which the phases do not tell
// apart), against the CPU backend's: targets on this rank, on another one, ignored, and at the
// slice's first and last column; the slices [0, 48), [48, 100), an empty one (a rank whose
// vocabulary slot is all padding), and [100, 2153) of a larger vocabulary, two or three packs a
// thread.
template <typename T>
void CheckVocabParallel(int v, int vocab_begin) {
  SCOPED_TRACE(::testing::Message() << "v " << v << " from " << vocab_begin);
  const std::vector<int32_t> targets = {-1, vocab_begin, 7, 99, vocab_begin + v - 1, 50};
  const int n = static_cast<int>(targets.size());
  std::vector<float> values = testing::RandomFloats(static_cast<size_t>(n) * v, 2, -4, 4);
  for (int j = 0; j < v; ++j) values[j] += 60.0f;  // exp would overflow without the max shift
  std::vector<T> logits = Store<T>(values);
  std::vector<float> stored = Load(logits);

  std::vector<float> max(n), sums(n), target_logits(n, -1.0f), losses(n);
  for (int row = 0; row < n; ++row) {
    const size_t at = static_cast<size_t>(row) * v;
    RunOnClassifierBlock<float>([&](const Block& block, float* shared) {
      VocabRowMax<kThreads>(block, shared, logits.data() + at, &max[row], v);
    });
    RunOnClassifierBlock<float>([&](const Block& block, float* shared) {
      VocabRowExpSum<kThreads>(block, shared, logits.data() + at, &sums[row], &target_logits[row],
                               max[row], targets[row], v, vocab_begin);
    });
    losses[row] = VocabRowLoss(max[row], sums[row], target_logits[row], targets[row]);
  }
  std::vector<float> max_cpu(n), sums_cpu(n), target_logits_cpu(n);
  cpu::ClassifierRowMax(max_cpu.data(), stored.data(), n, v, nullptr);
  EXPECT_EQ(max, max_cpu) << "the maximum is exact";
  cpu::ClassifierExpSums(stored.data(), sums_cpu.data(), target_logits_cpu.data(), max_cpu.data(),
                         targets.data(), n, v, vocab_begin, nullptr);
  EXPECT_EQ(target_logits, target_logits_cpu);
  ExpectMatches(logits, stored, "exponentials");
  ExpectFloatMatches(sums, sums_cpu, "sums");
  if (v == 0) return;  // log(0): no row's loss or gradient comes from this rank alone
  double loss = 0;
  for (const float row_loss : losses) loss += row_loss;
  const double loss_cpu = cpu::ClassifierLossSum(max_cpu.data(), sums_cpu.data(),
                                                 target_logits_cpu.data(), targets.data(), n);
  EXPECT_NEAR(loss, loss_cpu, testing::kFloatTolerance * std::abs(loss_cpu));

  stored = Load(logits);
  for (int row = 0; row < n; ++row) {
    RunOnHostBlock<kThreads>([&](const Block& block) {
      VocabRowLogitsBackward<kThreads>(block, logits.data() + static_cast<size_t>(row) * v,
                                       sums[row], targets[row], v, vocab_begin, kGradScale);
    });
  }
  cpu::ClassifierLogitsBackward(stored.data(), sums.data(), targets.data(), n, v, vocab_begin,
                                kGradScale, nullptr);
  ExpectMatches(logits, stored, "dlogits");
}

TEST(CudaClassifierTest, VocabParallelPhasesMatchCpuBackend) {
  for (const auto& [v, begin] :
       {std::pair{48, 0}, std::pair{52, 48}, std::pair{0, 100}, std::pair{2053, 100}}) {
    CheckVocabParallel<float>(v, begin);
    CheckVocabParallel<Bf16>(v, begin);
  }
}

}  // namespace
}  // namespace dtrain::cuda
