// Row-major GEMM on OpenBLAS for both scalar types the kernels are instantiated with:
// c (M,N) = alpha * op(a) op(b) + beta * c. Overloads rather than a template so a templated
// kernel calls Gemm(...) and gets cblas_sgemm or cblas_dgemm.
#pragma once

namespace dtrain::cpu {

void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc);
void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, double alpha, const double* a,
          int lda, const double* b, int ldb, double beta, double* c, int ldc);

// OpenBLAS's threads for every GEMM from now on (process-wide): run.threads when set, so that
// a process told to use one core does not run its GEMMs on all of them.
void SetBlasThreads(int threads);

// While alive, OpenBLAS runs every GEMM on its calling thread. Kernels that split their work
// across the pool and call many small GEMMs hold one: a pool thread's GEMM fanning out to
// OpenBLAS's own threads oversubscribes the cores and serializes on OpenBLAS's level-3 lock
// (attention at GPT-2 small sizes ran 12x slower). The setting is process-wide, which is safe
// because a backend has one caller at a time.
class SerialBlasScope {
 public:
  SerialBlasScope();
  ~SerialBlasScope();
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  int saved_threads_;
};

}  // namespace dtrain::cpu
