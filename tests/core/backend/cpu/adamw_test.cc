#include "core/backend/cpu/adamw.h"

#include <cmath>
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
    AdamW(p.data(), grad.data(), m.data(), v.data(), n, kLr, kBeta1, kBeta2, kEps, kWeightDecay,
          step, nullptr);
    const std::vector<float> grad_f(grad.begin(), grad.end());
    backend.AdamW(p_f.data(), grad_f.data(), m_f.data(), v_f.data(), n, kLr, kBeta1, kBeta2, kEps,
                  kWeightDecay, step);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(p[i], reference[i].p, 1e-14) << "step " << step << " value " << i;
      EXPECT_NEAR(m[i], reference[i].m, 1e-14);
      EXPECT_NEAR(v[i], reference[i].v, 1e-14);
      // float state: a few float roundings per step, relative to O(1) values.
      EXPECT_NEAR(p_f[i], reference[i].p, 1e-6) << "step " << step << " value " << i;
    }
  }
}

}  // namespace
}  // namespace dtrain::cpu
