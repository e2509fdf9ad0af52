#include "core/backend/cpu/gemm.h"

#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::RandomVector;

// C = alpha op(A) op(B) + beta C with explicit loops, reading A and B through their strides.
std::vector<double> NaiveGemm(bool ta, bool tb, int m, int n, int k, double alpha,
                              const std::vector<double>& a, int lda, const std::vector<double>& b,
                              int ldb, double beta, std::vector<double> c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        sum += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      }
      c[i * ldc + j] = alpha * sum + beta * c[i * ldc + j];
    }
  }
  return c;
}

TEST(GemmTest, AllTransposesWithPaddedStridesMatchLoops) {
  const int m = 5, n = 7, k = 3, pad = 2;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int lda = (ta ? m : k) + pad;
      const int ldb = (tb ? k : n) + pad;
      const int ldc = n + pad;
      const auto a = RandomVector((ta ? k : m) * lda, 1);
      const auto b = RandomVector((tb ? n : k) * ldb, 2);
      const auto c0 = RandomVector(m * ldc, 3);
      const auto expected = NaiveGemm(ta, tb, m, n, k, 0.5, a, lda, b, ldb, 2.0, c0, ldc);
      std::vector<double> c = c0;
      Gemm(ta, tb, m, n, k, 0.5, a.data(), lda, b.data(), ldb, 2.0, c.data(), ldc);
      for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], expected[i], 1e-12);

      CpuBackend backend(2);
      std::vector<float> cf = testing::ToFloat(c0);
      const auto af = testing::ToFloat(a);
      const auto bf = testing::ToFloat(b);
      backend.Gemm(ta, tb, m, n, k, 0.5f, af.data(), lda, bf.data(), ldb, 2.0f, cf.data(), ldc);
      testing::ExpectFloatMatches(cf, expected, "c");
    }
  }
}

}  // namespace
}  // namespace dtrain::cpu
