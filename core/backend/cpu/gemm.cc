#include "core/backend/cpu/gemm.h"

#include <cblas.h>

namespace dtrain::cpu {

static CBLAS_TRANSPOSE Op(bool transpose) { return transpose ? CblasTrans : CblasNoTrans; }

// An empty output needs no call; OpenBLAS would reject its leading dimensions.
void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, Op(transpose_a), Op(transpose_b), m, n, k, alpha, a, lda, b, ldb, beta,
              c, ldc);
}

void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, double alpha, const double* a,
          int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, Op(transpose_a), Op(transpose_b), m, n, k, alpha, a, lda, b, ldb, beta,
              c, ldc);
}

void SetBlasThreads(int threads) { openblas_set_num_threads(threads); }

SerialBlasScope::SerialBlasScope() : saved_threads_(openblas_get_num_threads()) {
  openblas_set_num_threads(1);
}

SerialBlasScope::~SerialBlasScope() { openblas_set_num_threads(saved_threads_); }

}  // namespace dtrain::cpu
