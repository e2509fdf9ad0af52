#include "core/backend/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::RandomVector;

constexpr double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;
constexpr int kSteps = 3;

// The textbook AdamW (Loshchilov and Hutter, as in torch.optim.AdamW) for one value.
struct Reference {
  double p, m = 0, v = 0;
  void Step(double g, int step) {
    m = kBeta1 * m + (1 - kBeta1) * g;
    v = kBeta2 * v + (1 - kBeta2) * g * g;
    const double m_hat = m / (1 - std::pow(kBeta1, step));
    const double v_hat = v / (1 - std::pow(kBeta2, step));
    p -= kLr * (m_hat / (std::sqrt(v_hat) + kEps) + kWeightDecay * p);
  }
};

TEST(AdamWTest, ThreeStepsMatchHandComputedReference) {
  const size_t n = 37;
  const auto p0 = RandomVector(n, 1);
  std::vector<Reference> reference;
  for (double p : p0) reference.push_back({p});
  std::vector<double> p = p0, m(n), v(n);
  std::vector<float> p_f(p0.begin(), p0.end()), m_f(n), v_f(n);
  CpuBackend backend(2);
  for (int step = 1; step <= kSteps; ++step) {
    const auto grad = RandomVector(n, 10 + step);
    for (size_t i = 0; i < n; ++i) reference[i].Step(grad[i], step);
    AdamW(p.data(), grad.data(), m.data(), v.data(), n,
          MakeAdamWCoefficients<double>(kLr, kBeta1, kBeta2, kEps, kWeightDecay, step, 1.0),
          nullptr);
    const std::vector<float> grad_f(grad.begin(), grad.end());
    const AdamWRange all{.begin = 0, .end = static_cast<int64_t>(n), .decay = 1};
    backend.AdamW(p_f.data(), nullptr, grad_f.data(), m_f.data(), v_f.data(), n, &all, 1,
                  {.lr = kLr,
                   .beta1 = kBeta1,
                   .beta2 = kBeta2,
                   .eps = kEps,
                   .weight_decay = kWeightDecay,
                   .step = step,
                   .grad_scale = 1.0f});
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(p[i], reference[i].p, 1e-14) << "step " << step << " value " << i;
      EXPECT_NEAR(m[i], reference[i].m, 1e-14);
      EXPECT_NEAR(v[i], reference[i].v, 1e-14);
      // float state: a few float roundings per step, relative to O(1) values.
      EXPECT_NEAR(p_f[i], reference[i].p, 1e-6) << "step " << step << " value " << i;
    }
  }
}

// Float runs 8 values at a time with a padded last group; the split of the range across threads
// must not change any value.
TEST(AdamWTest, FloatIsBitIdenticalWhateverTheThreadSplit) {
  const size_t n = (size_t{1} << 16) + 13;  // more than one chunk per thread, a partial group
  const auto p0 = RandomVector(n, 2);
  const auto grad_d = RandomVector(n, 3);
  const std::vector<float> grad(grad_d.begin(), grad_d.end());
  std::vector<std::vector<float>> results;
  for (int threads : {0, 1, 2, 3}) {
    std::vector<float> p(p0.begin(), p0.end()), m(n), v(n);
    ThreadPool pool(std::max(threads, 1));
    for (int step = 1; step <= kSteps; ++step) {
      AdamW(p.data(), grad.data(), m.data(), v.data(), n,
            MakeAdamWCoefficients<float>(kLr, kBeta1, kBeta2, kEps, kWeightDecay, step, 1.0),
            threads == 0 ? nullptr : &pool);
    }
    results.push_back(p);
  }
  for (size_t r = 1; r < results.size(); ++r) {
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), n * sizeof(float)), 0)
        << "split " << r;
  }
}

}  // namespace
}  // namespace dtrain::cpu
