// Helpers shared by the CPU kernel tests: random inputs, the central-difference gradient check
// of a scalar loss, and the float-versus-double comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::cpu::testing {

// Finite differences: step and the tolerance on |analytic - numeric| relative to
// max(1, |numeric|). Central differences in double have truncation error ~eps^2 and rounding
// error ~1e-16 * |L| / eps, both far below 1e-6 for the O(1) losses used here.
inline constexpr double kFiniteDifferenceStep = 1e-6;
inline constexpr double kGradientTolerance = 1e-6;
// Float kernels against the double ones on the same inputs, relative to max(1, |double|).
inline constexpr double kFloatTolerance = 1e-5;

inline std::vector<double> RandomVector(size_t n, unsigned seed, double lo = -1.0,
                                        double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> values(n);
  for (double& v : values) v = dist(rng);
  return values;
}

inline std::vector<float> ToFloat(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

// Rounds through float so the double reference sees exactly the float kernel's inputs.
inline std::vector<double> RoundToFloat(const std::vector<double>& values) {
  std::vector<double> rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) rounded[i] = static_cast<float>(values[i]);
  return rounded;
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// Checks analytic[k] against (loss(x + eps e_k) - loss(x - eps e_k)) / (2 eps) for every k;
// `loss` reads x, which this perturbs in place and restores.
inline void ExpectGradientMatches(std::vector<double>& x, const std::function<double()>& loss,
                                  const std::vector<double>& analytic, const char* what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (size_t k = 0; k < x.size(); ++k) {
    const double saved = x[k];
    x[k] = saved + kFiniteDifferenceStep;
    const double plus = loss();
    x[k] = saved - kFiniteDifferenceStep;
    const double minus = loss();
    x[k] = saved;
    const double numeric = (plus - minus) / (2 * kFiniteDifferenceStep);
    ASSERT_NEAR(analytic[k], numeric, kGradientTolerance * std::max(1.0, std::abs(numeric)))
        << what << "[" << k << "]";
  }
}

inline void ExpectFloatMatches(const std::vector<float>& actual,
                               const std::vector<double>& expected, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], kFloatTolerance * std::max(1.0, std::abs(expected[i])))
        << what << "[" << i << "]";
  }
}

// after - before: what a kernel added into an accumulating gradient.
inline std::vector<double> Difference(const std::vector<double>& after,
                                      const std::vector<double>& before) {
  std::vector<double> diff(after.size());
  for (size_t i = 0; i < after.size(); ++i) diff[i] = after[i] - before[i];
  return diff;
}

}  // namespace dtrain::cpu::testing
