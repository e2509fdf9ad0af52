#include "core/backend/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "core/backend/cpu/activation.h"
#include "core/backend/cpu/adamw.h"
#include "core/backend/cpu/attention.h"
#include "core/backend/cpu/classifier.h"
#include "core/backend/cpu/elementwise.h"
#include "core/backend/cpu/embedding.h"
#include "core/backend/cpu/gemm.h"
#include "core/backend/cpu/linear.h"
#include "core/backend/cpu/norm.h"
#include "core/backend/cpu/parallel.h"
#include "core/backend/cpu/rope.h"
#include "core/backend/cuda/bf16.h"

namespace dtrain {

CpuBackend::CpuBackend(int num_threads, MatmulPrecision matmul_precision)
    : pool_(num_threads), matmul_precision_(matmul_precision) {}

namespace {
// A cache line, and the widest vector load (AVX-512).
constexpr std::align_val_t kAlignment{64};
}  // namespace

DeviceBuffer CpuBackend::Allocate(size_t count, DataType dtype) {
  const size_t bytes = count * DataTypeBytes(dtype);
  void* data = ::operator new(std::max<size_t>(bytes, 1), kAlignment);
  std::memset(data, 0, bytes);
  allocations_.Add(data, bytes);
  return DeviceBuffer(this, data, count, dtype);
}

void CpuBackend::Free(void* data) {
  allocations_.Remove(data);
  ::operator delete(data, kAlignment);
}

void CpuBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void CpuBackend::CopyToHost(void* host, const void* src, size_t bytes) { Copy(host, src, bytes); }
void CpuBackend::CopyFromHost(void* dst, const void* host, size_t bytes) { Copy(dst, host, bytes); }

Backend::Memory CpuBackend::AvailableMemory() const {
  return {.name = "this machine",
          .bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                   static_cast<double>(sysconf(_SC_PAGESIZE)),
          .shared_by_local_ranks = true};
}

float* CpuBackend::Scratch(size_t size) {
  if (scratch_.size() < size) scratch_.resize(size);
  return scratch_.data();
}

const float* CpuBackend::MatmulOperand(const float* x, size_t count, int slot) {
  if (matmul_precision_ == MatmulPrecision::kHighest || x == nullptr) return x;
  std::vector<float>& rounded = operands_[slot];
  if (rounded.size() < count) rounded.resize(count);
  float* out = rounded.data();
  const MatmulPrecision precision = matmul_precision_;
  cpu::ParallelFor(&pool_, count, 4096, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) out[i] = RoundForMatmul(x[i], precision);
  });
  return out;
}

void CpuBackend::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                      const float* a, int lda, const float* b, int ldb, float beta, float* c,
                      int ldc) {
  cpu::Gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuBackend::LinearForward(float* out, const float* inp, const float* weight, const float* bias,
                               int n, int in_features, int out_features) {
  cpu::LinearForward(out, MatmulOperand(inp, static_cast<size_t>(n) * in_features, 0),
                     MatmulOperand(weight, static_cast<size_t>(out_features) * in_features, 1),
                     bias, n, in_features, out_features, &pool_);
}

void CpuBackend::AddBias(float* out, const float* bias, int n, int c) {
  cpu::AddBias(out, bias, n, c, &pool_);
}

void CpuBackend::LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                const float* inp, const float* weight, int n, int in_features,
                                int out_features) {
  // The bias gradient sums dout itself: it is no GEMM on the GPU either.
  cpu::LinearBackward<float>(
      dinp, dweight, nullptr, MatmulOperand(dout, static_cast<size_t>(n) * out_features, 0),
      MatmulOperand(inp, static_cast<size_t>(n) * in_features, 1),
      MatmulOperand(weight, static_cast<size_t>(out_features) * in_features, 2), n, in_features,
      out_features, &pool_);
  if (dbias != nullptr) cpu::AddColumnSums(dbias, dout, n, out_features, &pool_);
}

void CpuBackend::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int n, int c, float eps) {
  cpu::LayerNormForward(out, mean, rstd, inp, weight, bias, n, c, eps, &pool_);
}

void CpuBackend::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, const float* mean,
                                   const float* rstd, int n, int c) {
  cpu::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c, &pool_);
}

void CpuBackend::RmsNormForward(float* out, float* rstd, const float* inp, const float* weight,
                                int n, int c, float eps) {
  cpu::RmsNormForward(out, rstd, inp, weight, n, c, eps, &pool_);
}

void CpuBackend::RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const float* rstd, int n, int c) {
  cpu::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, n, c, &pool_);
}

void CpuBackend::GeluForward(float* out, const float* inp, size_t n) {
  cpu::GeluForward(out, inp, n, &pool_);
}

void CpuBackend::GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  cpu::GeluBackward(dinp, inp, dout, n, &pool_);
}

void CpuBackend::SwiGluForward(float* out, const float* gate_up, int n, int f) {
  cpu::SwiGluForward(out, gate_up, n, f, &pool_);
}

void CpuBackend::SwiGluBackward(float* dgate_up, const float* gate_up, const float* dout, int n,
                                int f) {
  cpu::SwiGluBackward(dgate_up, gate_up, dout, n, f, &pool_);
}

void CpuBackend::RopeForward(float* qkv, const AttentionShape& shape, float theta, int pos_offset,
                             const int32_t* positions) {
  cpu::RopeForward(qkv, shape, theta, pos_offset, &pool_, positions);
}

void CpuBackend::RopeBackward(float* dqkv, const AttentionShape& shape, float theta, int pos_offset,
                              const int32_t* positions) {
  cpu::RopeBackward(dqkv, shape, theta, pos_offset, &pool_, positions);
}

void CpuBackend::AttentionForward(float* out, float* lse, const float* qkv,
                                  const AttentionShape& shape, const int32_t* positions) {
  float* scratch = Scratch(cpu::AttentionScratchSize(shape) * pool_.size());
  cpu::AttentionForward(out, lse, qkv, shape, scratch, &pool_, positions);
}

void CpuBackend::AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                   const float* out, const float* lse, const AttentionShape& shape,
                                   const int32_t* positions) {
  float* scratch = Scratch(cpu::AttentionScratchSize(shape) * pool_.size());
  cpu::AttentionBackward(dqkv, dout, qkv, out, lse, shape, scratch, &pool_, positions);
}

void CpuBackend::EmbeddingForward(float* out, const int32_t* tokens, const float* token_embedding,
                                  const float* position_embedding, int b, int t, int c,
                                  int vocab_begin, int vocab_end, const int32_t* positions) {
  cpu::EmbeddingForward(out, tokens, token_embedding, position_embedding, b, t, c, vocab_begin,
                        vocab_end, &pool_, positions);
}

void CpuBackend::EmbeddingBackward(float* dtoken_embedding, float* dposition_embedding,
                                   const float* dout, const int32_t* tokens, int b, int t, int c,
                                   int vocab_begin, int vocab_end, const int32_t* positions) {
  cpu::EmbeddingBackward(dtoken_embedding, dposition_embedding, dout, tokens, b, t, c, vocab_begin,
                         vocab_end, &pool_, positions);
}

void CpuBackend::ClassifierForwardBackward(float* dx, float* dweight, const float* x,
                                           const float* weight, const int32_t* targets, int n,
                                           int c, int v, float grad_scale, double* loss_sum) {
  const int chunk_rows = std::min(n, ClassifierChunkRows(v));
  float* scratch = Scratch(cpu::ClassifierScratchSize(chunk_rows, v));
  *loss_sum += cpu::ClassifierForwardBackward(
      dx, dweight, MatmulOperand(x, static_cast<size_t>(n) * c, 0),
      MatmulOperand(weight, static_cast<size_t>(v) * c, 1), targets, n, c, v, grad_scale,
      chunk_rows, scratch, &pool_, matmul_precision_);
}

void CpuBackend::ClassifierRowMax(float* max, const float* logits, int n, int v) {
  cpu::ClassifierRowMax(max, logits, n, v, &pool_);
}

void CpuBackend::ClassifierExpSums(float* logits, float* sums, float* target_logits,
                                   const float* max, const int32_t* targets, int n, int v,
                                   int vocab_begin) {
  cpu::ClassifierExpSums(logits, sums, target_logits, max, targets, n, v, vocab_begin, &pool_);
}

void CpuBackend::ClassifierLossSum(const float* max, const float* sums, const float* target_logits,
                                   const int32_t* targets, int n, double* loss_sum) {
  *loss_sum += cpu::ClassifierLossSum(max, sums, target_logits, targets, n);
}

void CpuBackend::ClassifierLogitsBackward(float* logits, const float* sums, const int32_t* targets,
                                          int n, int v, int vocab_begin, float grad_scale) {
  cpu::ClassifierLogitsBackward(logits, sums, targets, n, v, vocab_begin, grad_scale, &pool_);
}

void CpuBackend::Add(float* out, const float* a, const float* b, size_t n) {
  cpu::Add(out, a, b, n, &pool_);
}

void CpuBackend::SumSquares(const float* x, size_t n, double* sum) {
  *sum += cpu::SumSquares(x, n, &pool_);
}

void CpuBackend::Scale(float* x, float factor, size_t n) { cpu::Scale(x, factor, n, &pool_); }

void CpuBackend::Zero(float* x, size_t n) { cpu::Zero(x, n, &pool_); }

void CpuBackend::RoundToBf16(uint16_t* out, const float* x, size_t n) {
  cpu::ParallelFor(&pool_, n, 1 << 16, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) out[i] = cuda::FloatToBf16Bits(x[i]);
  });
}

void CpuBackend::WidenBf16(float* out, const uint16_t* x, size_t n) {
  cpu::ParallelFor(&pool_, n, 1 << 16, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) out[i] = cuda::Bf16BitsToFloat(x[i]);
  });
}

void CpuBackend::AdamW(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  cpu::AdamW(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step, &pool_);
}

}  // namespace dtrain
