#include "core/backend/cpu/classifier.h"

#include <cmath>
#include <utility>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::Difference;
using testing::ExpectFloatMatches;
using testing::ExpectGradientMatches;
using testing::RandomVector;
using testing::RoundToFloat;
using testing::ToFloat;

// More rows than one chunk, and not a multiple of it.
constexpr int kChunkRows = 16;
constexpr int kRows = 2 * kChunkRows + 5, kChannels = 4, kVocab = 7;

std::vector<int32_t> Targets(int n, int v) {
  std::vector<int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[i] = (i % 9 == 4) ? -1 : (i * 3) % v;  // some ignored
  return targets;
}

// Sum over non-ignored rows of -log_softmax(x w^T)[target], from the definition.
double NaiveLoss(const std::vector<double>& x, const std::vector<double>& w,
                 const std::vector<int32_t>& targets, int n, int c, int v) {
  double loss = 0;
  for (int i = 0; i < n; ++i) {
    if (targets[i] < 0) continue;
    std::vector<double> logits(v);
    double max = -1e300;
    for (int j = 0; j < v; ++j) {
      for (int k = 0; k < c; ++k) logits[j] += x[i * c + k] * w[j * c + k];
      max = std::max(max, logits[j]);
    }
    double sum = 0;
    for (int j = 0; j < v; ++j) sum += std::exp(logits[j] - max);
    loss -= logits[targets[i]] - max - std::log(sum);
  }
  return loss;
}

TEST(ClassifierTest, LossMatchesNaiveLogSoftmaxAndIgnoresNegativeTargets) {
  const auto x = RandomVector(kRows * kChannels, 1, -2, 2);
  const auto w = RandomVector(kVocab * kChannels, 2, -2, 2);
  const auto targets = Targets(kRows, kVocab);
  std::vector<double> scratch(ClassifierScratchSize(kChunkRows, kVocab));
  const double loss = ClassifierForwardBackward<double>(nullptr, nullptr, x.data(), w.data(),
                                                        targets.data(), kRows, kChannels, kVocab,
                                                        1.0, kChunkRows, scratch.data(), nullptr);
  EXPECT_NEAR(loss, NaiveLoss(x, w, targets, kRows, kChannels, kVocab), 1e-10);

  std::vector<int32_t> all_ignored(kRows, -1);
  std::vector<double> dx(x.size(), 5.0), dw(w.size(), 0.0);
  EXPECT_EQ(ClassifierForwardBackward<double>(dx.data(), dw.data(), x.data(), w.data(),
                                              all_ignored.data(), kRows, kChannels, kVocab, 1.0,
                                              kChunkRows, scratch.data(), nullptr),
            0.0);
  for (double g : dx) EXPECT_EQ(g, 0.0);
  for (double g : dw) EXPECT_EQ(g, 0.0);
}

TEST(ClassifierTest, GradientsMatchFiniteDifferencesOfScaledLoss) {
  auto x = RandomVector(kRows * kChannels, 1, -2, 2);
  auto w = RandomVector(kVocab * kChannels, 2, -2, 2);
  const auto targets = Targets(kRows, kVocab);
  const double grad_scale = 0.37;
  std::vector<double> scratch(ClassifierScratchSize(kChunkRows, kVocab));
  auto loss = [&] {
    return grad_scale * ClassifierForwardBackward<double>(nullptr, nullptr, x.data(), w.data(),
                                                          targets.data(), kRows, kChannels, kVocab,
                                                          1.0, kChunkRows, scratch.data(), nullptr);
  };
  const auto dw0 = RandomVector(w.size(), 3);
  auto dx = RandomVector(x.size(), 4);  // written, whatever it held
  auto dw = dw0;
  ClassifierForwardBackward<double>(dx.data(), dw.data(), x.data(), w.data(), targets.data(), kRows,
                                    kChannels, kVocab, grad_scale, kChunkRows, scratch.data(),
                                    nullptr);
  ExpectGradientMatches(x, loss, dx, "dx");
  ExpectGradientMatches(w, loss, Difference(dw, dw0), "dweight");
}

// The vocabulary-parallel phases over slots [0, 4), [4, 7) and an empty [7, 7) of the
// vocabulary, the ranks' statistics combined here as the all-reduces would (maximum, then sums),
// give the fused kernel's loss, dx (the ranks' partial dx summed) and dweight (each slot's rows).
// In double both sides agree to rounding: 1e-12.
TEST(ClassifierTest, VocabularyParallelPhasesMatchTheFusedKernel) {
  const auto x = RandomVector(kRows * kChannels, 1, -2, 2);
  const auto w = RandomVector(kVocab * kChannels, 2, -2, 2);
  const auto targets = Targets(kRows, kVocab);
  const double grad_scale = 0.37;
  std::vector<double> scratch(ClassifierScratchSize(kRows, kVocab));
  std::vector<double> dx(x.size()), dw(w.size());
  const double loss = ClassifierForwardBackward<double>(dx.data(), dw.data(), x.data(), w.data(),
                                                        targets.data(), kRows, kChannels, kVocab,
                                                        grad_scale, kRows, scratch.data(), nullptr);

  const std::vector<std::pair<int, int>> slots = {{0, 4}, {4, 7}, {7, 7}};
  std::vector<std::vector<double>> logits;
  std::vector<double> max(kRows, -INFINITY), sums(kRows), target_logits(kRows);
  for (const auto& [begin, end] : slots) {
    const int v = end - begin;
    logits.emplace_back(static_cast<size_t>(kRows) * v);
    for (int i = 0; i < kRows; ++i) {
      for (int j = 0; j < v; ++j) {
        for (int k = 0; k < kChannels; ++k) {
          logits.back()[i * v + j] += x[i * kChannels + k] * w[(begin + j) * kChannels + k];
        }
      }
    }
    std::vector<double> rank_max(kRows);
    ClassifierRowMax<double>(rank_max.data(), logits.back().data(), kRows, v, nullptr);
    for (int i = 0; i < kRows; ++i) max[i] = std::max(max[i], rank_max[i]);
  }
  for (size_t s = 0; s < slots.size(); ++s) {
    const auto [begin, end] = slots[s];
    std::vector<double> rank_sums(kRows), rank_targets(kRows);
    ClassifierExpSums<double>(logits[s].data(), rank_sums.data(), rank_targets.data(), max.data(),
                              targets.data(), kRows, end - begin, begin, nullptr);
    for (int i = 0; i < kRows; ++i) {
      sums[i] += rank_sums[i];
      target_logits[i] += rank_targets[i];
    }
  }
  EXPECT_NEAR(ClassifierLossSum<double>(max.data(), sums.data(), target_logits.data(),
                                        targets.data(), kRows),
              loss, 1e-12 * loss);
  std::vector<double> split_dx(x.size());
  for (size_t s = 0; s < slots.size(); ++s) {
    const auto [begin, end] = slots[s];
    const int v = end - begin;
    ClassifierLogitsBackward<double>(logits[s].data(), sums.data(), targets.data(), kRows, v, begin,
                                     grad_scale, nullptr);
    for (int i = 0; i < kRows; ++i) {
      for (int j = 0; j < v; ++j) {
        const double g = logits[s][i * v + j];
        for (int k = 0; k < kChannels; ++k) {
          split_dx[i * kChannels + k] += g * w[(begin + j) * kChannels + k];
        }
      }
    }
    // dweight rows of this slot: dlogits^T x.
    for (int j = 0; j < v; ++j) {
      for (int k = 0; k < kChannels; ++k) {
        double g = 0;
        for (int i = 0; i < kRows; ++i) g += logits[s][i * v + j] * x[i * kChannels + k];
        EXPECT_NEAR(g, dw[(begin + j) * kChannels + k], 1e-12) << "row " << begin + j;
      }
    }
  }
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(split_dx[i], dx[i], 1e-12) << "dx " << i;
}

TEST(ClassifierTest, ChunkRowsFitTheScratchBudget) {
  EXPECT_EQ(ClassifierChunkRows(50257), 640);    // 128 MiB / (50257 * 4 B) = 667, down to 64s
  EXPECT_EQ(ClassifierChunkRows(1 << 22), 128);  // never fewer than 128 rows
  EXPECT_GE(ClassifierChunkRows(256), 1 << 16);  // a byte vocabulary: the whole batch at once
}

// The backend picks its own chunk (the whole batch here); the double reference uses small ones.
TEST(ClassifierTest, FloatBackendMatchesDouble) {
  const int n = 2 * kChunkRows + 17, c = 24, v = 301;
  const auto x = RoundToFloat(RandomVector(n * c, 1));
  const auto w = RoundToFloat(RandomVector(v * c, 2));
  const auto targets = Targets(n, v);
  const double grad_scale = 1.0 / n;
  std::vector<double> dx(x.size()), dw(w.size()), scratch(ClassifierScratchSize(kChunkRows, v));
  const double loss =
      ClassifierForwardBackward<double>(dx.data(), dw.data(), x.data(), w.data(), targets.data(), n,
                                        c, v, grad_scale, kChunkRows, scratch.data(), nullptr);

  CpuBackend backend(2);
  const auto x_f = ToFloat(x), w_f = ToFloat(w);
  std::vector<float> dx_f(x.size()), dw_f(w.size());
  double loss_f = 0;
  backend.ClassifierForwardBackward(dx_f.data(), dw_f.data(), x_f.data(), w_f.data(),
                                    targets.data(), n, c, v, static_cast<float>(grad_scale),
                                    &loss_f);
  EXPECT_NEAR(loss_f, loss, testing::kFloatTolerance * loss);
  ExpectFloatMatches(dx_f, dx, "dx");
  ExpectFloatMatches(dw_f, dw, "dweight");
  // The loss-only call adds the same loss, bit for bit: the same GEMM and row loop.
  double loss_twice = loss_f;
  backend.ClassifierForwardBackward(nullptr, nullptr, x_f.data(), w_f.data(), targets.data(), n, c,
                                    v, 1.0f, &loss_twice);
  EXPECT_EQ(loss_twice, 2 * loss_f);
}

}  // namespace
}  // namespace dtrain::cpu
