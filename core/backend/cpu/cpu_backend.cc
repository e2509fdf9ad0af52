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
// Blocks this large are cached when freed (smaller ones glibc keeps in its bins well).
constexpr size_t kCachedBlockBytes = size_t{64} << 10;
constexpr size_t kMaxCachedBytes = size_t{1} << 30;
}  // namespace

CpuBackend::~CpuBackend() {
  for (const auto& [bytes, block] : cached_) ::operator delete(block, kAlignment);
}

DeviceBuffer CpuBackend::Allocate(size_t count, DataType dtype) {
  const size_t bytes = count * DataTypeBytes(dtype);
  void* data = nullptr;
  if (bytes >= kCachedBlockBytes) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (const auto it = cached_.find(bytes); it != cached_.end()) {
      data = it->second;
      cached_.erase(it);
      cached_bytes_ -= bytes;
    }
  }
  if (data == nullptr) data = ::operator new(std::max<size_t>(bytes, 1), kAlignment);
  std::memset(data, 0, bytes);
  allocations_.Add(data, bytes);
  return DeviceBuffer(this, data, count, dtype);
}

void CpuBackend::Free(void* data) {
  const size_t bytes = allocations_.Remove(data);
  if (bytes >= kCachedBlockBytes) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cached_bytes_ + bytes <= kMaxCachedBytes) {
      cached_.emplace(bytes, data);
      cached_bytes_ += bytes;
      return;
    }
  }
  ::operator delete(data, kAlignment);
}

void CpuBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void CpuBackend::CopyToHost(void* host, const void* src, size_t bytes) { Copy(host, src, bytes); }
void CpuBackend::CopyFromHost(void* dst, const void* host, size_t bytes) { Copy(dst, host, bytes); }

Backend::Memory CpuBackend::MachineMemory() {
  const double bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  return {.name = "this machine", .bytes = bytes, .shared_by_local_ranks = true, .capacity = bytes};
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

namespace {

// Elements of an attention call's qkv (B, T, qkv_width) and out (B, T, H*D).
size_t QkvCount(const AttentionShape& shape) {
  return static_cast<size_t>(shape.batch) * shape.time * shape.qkv_width();
}
size_t OutCount(const AttentionShape& shape) {
  return static_cast<size_t>(shape.batch) * shape.time * shape.heads * shape.head_dim;
}

// out (n) = x (n) in out's type: copied, widened or rounded to nearest even.
void ConvertValues(Values out, ConstValues x, size_t n, ThreadPool* pool) {
  if (out.dtype() == x.dtype()) {
    if (n > 0) std::memcpy(out.data(), x.data(), n * DataTypeBytes(x.dtype()));
    return;
  }
  if (const float* from = x.as<float>()) {
    auto* to = out.as<Bf16>();
    cpu::ParallelFor(pool, n, 1 << 16, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) to[i] = cuda::FromFloat<Bf16>(from[i]);
    });
  } else {
    const Bf16* from_bf16 = x.as<Bf16>();
    float* to = out.as<float>();
    cpu::ParallelFor(pool, n, 1 << 16, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) to[i] = cuda::ToFloat(from_bf16[i]);
    });
  }
}

// What a kernel does with one of its Values: reads them, writes them, or reads and writes them
// (an accumulated gradient, an update in place).
enum class Access { kRead, kWrite, kUpdate };

// Values as the float kernels of this folder take them: the values themselves when they are
// float32 (or null); bf16 ones widened into a float32 copy (unless only written), which a view
// of values written is rounded back from, to nearest even, when it goes away.
class FloatView {
 public:
  FloatView(ConstValues values, size_t count, ThreadPool* pool) : pool_(pool) {
    if (values.dtype() == DataType::kF32 || values.null()) {
      data_ = const_cast<float*>(values.as<float>());
      return;
    }
    copy_.resize(count);
    data_ = copy_.data();
    ConvertValues(data_, values, count, pool_);
  }
  FloatView(Values values, size_t count, Access access, ThreadPool* pool)
      : FloatView(access == Access::kWrite ? ConstValues() : ConstValues(values), count, pool) {
    if (values.dtype() == DataType::kF32 || values.null()) {
      data_ = values.as<float>();
      return;
    }
    if (copy_.empty()) copy_.resize(count);
    data_ = copy_.data();
    written_ = values;
  }
  ~FloatView() {
    if (!written_.null()) ConvertValues(written_, data_, copy_.size(), pool_);
  }
  FloatView(const FloatView&) = delete;
  FloatView& operator=(const FloatView&) = delete;

  float* data() const { return data_; }

 private:
  ThreadPool* pool_;
  std::vector<float> copy_;
  float* data_ = nullptr;
  Values written_;  // bf16 values the copy is rounded back into
};

}  // namespace

void CpuBackend::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                      const float* a, int lda, const float* b, int ldb, float beta, float* c,
                      int ldc) {
  cpu::Gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuBackend::LinearInto(float* out, ConstValues inp, ConstValues weight, ConstValues bias,
                            int n, int in_features, int out_features) {
  const size_t inputs = static_cast<size_t>(n) * in_features;
  const size_t weights = static_cast<size_t>(out_features) * in_features;
  const FloatView inp_f(inp, inputs, &pool_), weight_f(weight, weights, &pool_),
      bias_f(bias, out_features, &pool_);
  cpu::LinearForward(out, MatmulOperand(inp_f.data(), inputs, 0),
                     MatmulOperand(weight_f.data(), weights, 1), bias_f.data(), n, in_features,
                     out_features, &pool_);
}

void CpuBackend::LinearForward(Values out, ConstValues inp, ConstValues weight, ConstValues bias,
                               int n, int in_features, int out_features) {
  FloatView out_f(out, static_cast<size_t>(n) * out_features, Access::kWrite, &pool_);
  LinearInto(out_f.data(), inp, weight, bias, n, in_features, out_features);
}

void CpuBackend::LinearGeluForward(Values out, Values pre, ConstValues inp, ConstValues weight,
                                   ConstValues bias, int n, int in_features, int out_features) {
  const size_t count = static_cast<size_t>(n) * out_features;
  FloatView pre_f(pre, count, Access::kWrite, &pool_), out_f(out, count, Access::kWrite, &pool_);
  LinearInto(pre_f.data(), inp, weight, bias, n, in_features, out_features);
  cpu::GeluForward(out_f.data(), pre_f.data(), count, &pool_);
}

void CpuBackend::AddBias(Values out, ConstValues bias, int n, int c) {
  FloatView out_f(out, static_cast<size_t>(n) * c, Access::kUpdate, &pool_);
  const FloatView bias_f(bias, c, &pool_);
  cpu::AddBias(out_f.data(), bias_f.data(), n, c, &pool_);
}

void CpuBackend::LinearBackwardInto(float* dinp, float* dweight, float* dbias, ConstValues dout,
                                    ConstValues inp, ConstValues weight, int n, int in_features,
                                    int out_features) {
  const size_t inputs = static_cast<size_t>(n) * in_features;
  const size_t outputs = static_cast<size_t>(n) * out_features;
  const size_t weights = static_cast<size_t>(out_features) * in_features;
  const FloatView dout_f(dout, outputs, &pool_), inp_f(inp, inputs, &pool_),
      weight_f(weight, weights, &pool_);
  // The bias gradient sums dout itself: it is no GEMM on the GPU either.
  cpu::LinearBackward<float>(dinp, dweight, nullptr, MatmulOperand(dout_f.data(), outputs, 0),
                             MatmulOperand(inp_f.data(), inputs, 1),
                             MatmulOperand(weight_f.data(), weights, 2), n, in_features,
                             out_features, &pool_);
  if (dbias != nullptr) cpu::AddColumnSums(dbias, dout_f.data(), n, out_features, &pool_);
}

void CpuBackend::LinearBackward(Values dinp, float* dweight, float* dbias, ConstValues dout,
                                ConstValues inp, ConstValues weight, int n, int in_features,
                                int out_features) {
  FloatView dinp_f(dinp, static_cast<size_t>(n) * in_features, Access::kWrite, &pool_);
  LinearBackwardInto(dinp_f.data(), dweight, dbias, dout, inp, weight, n, in_features,
                     out_features);
}

void CpuBackend::LinearBackwardThroughGelu(Values dpre, float* dweight, float* dbias,
                                           ConstValues dout, ConstValues inp, ConstValues pre,
                                           ConstValues weight, int n, int in_features,
                                           int out_features) {
  const size_t count = static_cast<size_t>(n) * in_features;
  FloatView dpre_f(dpre, count, Access::kWrite, &pool_);
  const FloatView pre_f(pre, count, &pool_);
  LinearBackwardInto(dpre_f.data(), dweight, dbias, dout, inp, weight, n, in_features,
                     out_features);
  cpu::GeluBackward(dpre_f.data(), pre_f.data(), dpre_f.data(), count, &pool_);  // in place
}

void CpuBackend::LayerNormForward(Values out, float* mean, float* rstd, ConstValues inp,
                                  ConstValues weight, ConstValues bias, int n, int c, float eps) {
  const size_t count = static_cast<size_t>(n) * c;
  FloatView out_f(out, count, Access::kWrite, &pool_);
  const FloatView inp_f(inp, count, &pool_), weight_f(weight, c, &pool_), bias_f(bias, c, &pool_);
  cpu::LayerNormForward(out_f.data(), mean, rstd, inp_f.data(), weight_f.data(), bias_f.data(), n,
                        c, eps, &pool_);
}

void CpuBackend::LayerNormBackward(Values dinp, float* dweight, float* dbias, ConstValues dout,
                                   ConstValues inp, ConstValues weight, const float* mean,
                                   const float* rstd, int n, int c) {
  const size_t count = static_cast<size_t>(n) * c;
  FloatView dinp_f(dinp, count, Access::kUpdate, &pool_);
  const FloatView dout_f(dout, count, &pool_), inp_f(inp, count, &pool_),
      weight_f(weight, c, &pool_);
  cpu::LayerNormBackward(dinp_f.data(), dweight, dbias, dout_f.data(), inp_f.data(),
                         weight_f.data(), mean, rstd, n, c, &pool_);
}

void CpuBackend::AddLayerNormForward(Values sum, Values out, float* mean, float* rstd,
                                     ConstValues residual, ConstValues inp, ConstValues weight,
                                     ConstValues bias, int n, int c, float eps) {
  Add(sum, residual, inp, static_cast<size_t>(n) * c);
  LayerNormForward(out, mean, rstd, sum, weight, bias, n, c, eps);
}

void CpuBackend::AddRmsNormForward(Values sum, Values out, float* rstd, ConstValues residual,
                                   ConstValues inp, ConstValues weight, int n, int c, float eps) {
  Add(sum, residual, inp, static_cast<size_t>(n) * c);
  RmsNormForward(out, rstd, sum, weight, n, c, eps);
}

void CpuBackend::RmsNormForward(Values out, float* rstd, ConstValues inp, ConstValues weight, int n,
                                int c, float eps) {
  const size_t count = static_cast<size_t>(n) * c;
  FloatView out_f(out, count, Access::kWrite, &pool_);
  const FloatView inp_f(inp, count, &pool_), weight_f(weight, c, &pool_);
  cpu::RmsNormForward(out_f.data(), rstd, inp_f.data(), weight_f.data(), n, c, eps, &pool_);
}

void CpuBackend::RmsNormBackward(Values dinp, float* dweight, ConstValues dout, ConstValues inp,
                                 ConstValues weight, const float* rstd, int n, int c) {
  const size_t count = static_cast<size_t>(n) * c;
  FloatView dinp_f(dinp, count, Access::kUpdate, &pool_);
  const FloatView dout_f(dout, count, &pool_), inp_f(inp, count, &pool_),
      weight_f(weight, c, &pool_);
  cpu::RmsNormBackward(dinp_f.data(), dweight, dout_f.data(), inp_f.data(), weight_f.data(), rstd,
                       n, c, &pool_);
}

void CpuBackend::GeluForward(Values out, ConstValues inp, size_t n) {
  FloatView out_f(out, n, Access::kWrite, &pool_);
  const FloatView inp_f(inp, n, &pool_);
  cpu::GeluForward(out_f.data(), inp_f.data(), n, &pool_);
}

void CpuBackend::GeluBackward(Values dinp, ConstValues inp, ConstValues dout, size_t n) {
  FloatView dinp_f(dinp, n, Access::kWrite, &pool_);
  const FloatView inp_f(inp, n, &pool_), dout_f(dout, n, &pool_);
  cpu::GeluBackward(dinp_f.data(), inp_f.data(), dout_f.data(), n, &pool_);
}

void CpuBackend::SwiGluForward(Values out, ConstValues gate_up, int n, int f) {
  const size_t count = static_cast<size_t>(n) * f;
  FloatView out_f(out, count, Access::kWrite, &pool_);
  const FloatView gate_up_f(gate_up, 2 * count, &pool_);
  cpu::SwiGluForward(out_f.data(), gate_up_f.data(), n, f, &pool_);
}

void CpuBackend::SwiGluBackward(Values dgate_up, ConstValues gate_up, ConstValues dout, int n,
                                int f) {
  const size_t count = static_cast<size_t>(n) * f;
  FloatView dgate_up_f(dgate_up, 2 * count, Access::kWrite, &pool_);
  const FloatView gate_up_f(gate_up, 2 * count, &pool_), dout_f(dout, count, &pool_);
  cpu::SwiGluBackward(dgate_up_f.data(), gate_up_f.data(), dout_f.data(), n, f, &pool_);
}

void CpuBackend::RopeForward(Values qkv, const AttentionShape& shape, float theta, int pos_offset,
                             const int32_t* positions) {
  FloatView qkv_f(qkv, QkvCount(shape), Access::kUpdate, &pool_);
  cpu::RopeForward(qkv_f.data(), shape, theta, pos_offset, &pool_, positions);
}

void CpuBackend::RopeBackward(Values dqkv, const AttentionShape& shape, float theta, int pos_offset,
                              const int32_t* positions) {
  FloatView dqkv_f(dqkv, QkvCount(shape), Access::kUpdate, &pool_);
  cpu::RopeBackward(dqkv_f.data(), shape, theta, pos_offset, &pool_, positions);
}

void CpuBackend::AttentionForward(Values out, float* lse, ConstValues qkv,
                                  const AttentionShape& shape, const int32_t* positions) {
  FloatView out_f(out, OutCount(shape), Access::kWrite, &pool_);
  const FloatView qkv_f(qkv, QkvCount(shape), &pool_);
  float* scratch = Scratch(cpu::AttentionScratchSize(shape) * pool_.size());
  cpu::AttentionForward(out_f.data(), lse, qkv_f.data(), shape, scratch, &pool_, positions);
}

void CpuBackend::AttentionBackward(Values dqkv, ConstValues dout, ConstValues qkv, ConstValues out,
                                   const float* lse, const AttentionShape& shape,
                                   const int32_t* positions) {
  FloatView dqkv_f(dqkv, QkvCount(shape), Access::kWrite, &pool_);
  const FloatView dout_f(dout, OutCount(shape), &pool_), qkv_f(qkv, QkvCount(shape), &pool_),
      out_f(out, OutCount(shape), &pool_);
  float* scratch = Scratch(cpu::AttentionScratchSize(shape) * pool_.size());
  cpu::AttentionBackward(dqkv_f.data(), dout_f.data(), qkv_f.data(), out_f.data(), lse, shape,
                         scratch, &pool_, positions);
}

void CpuBackend::EmbeddingForward(Values out, const int32_t* tokens, ConstValues token_embedding,
                                  ConstValues position_embedding, int b, int t, int c,
                                  int vocab_begin, int vocab_end, const int32_t* positions) {
  FloatView out_f(out, static_cast<size_t>(b) * t * c, Access::kWrite, &pool_);
  // Positions are below t, so the first t rows of the position table are all it reads.
  const FloatView token_f(token_embedding, static_cast<size_t>(vocab_end - vocab_begin) * c,
                          &pool_),
      position_f(position_embedding, static_cast<size_t>(t) * c, &pool_);
  cpu::EmbeddingForward(out_f.data(), tokens, token_f.data(), position_f.data(), b, t, c,
                        vocab_begin, vocab_end, &pool_, positions);
}

void CpuBackend::EmbeddingBackward(float* dtoken_embedding, float* dposition_embedding,
                                   ConstValues dout, const int32_t* tokens, int b, int t, int c,
                                   int vocab_begin, int vocab_end, const int32_t* positions) {
  const FloatView dout_f(dout, static_cast<size_t>(b) * t * c, &pool_);
  cpu::EmbeddingBackward(dtoken_embedding, dposition_embedding, dout_f.data(), tokens, b, t, c,
                         vocab_begin, vocab_end, &pool_, positions);
}

void CpuBackend::ClassifierForwardBackward(Values dx, float* dweight, ConstValues x,
                                           ConstValues weight, const int32_t* targets, int n, int c,
                                           int v, float grad_scale, double* loss_sum) {
  const size_t inputs = static_cast<size_t>(n) * c;
  const size_t weights = static_cast<size_t>(v) * c;
  FloatView dx_f(dx, inputs, Access::kWrite, &pool_);
  const FloatView x_f(x, inputs, &pool_), weight_f(weight, weights, &pool_);
  const int chunk_rows = std::min(n, ClassifierChunkRows(v));
  float* scratch = Scratch(cpu::ClassifierScratchSize(chunk_rows, v));
  // Bf16 inputs: the logits are bf16 too, as the CUDA backend keeps them.
  *loss_sum += cpu::ClassifierForwardBackward(
      dx_f.data(), dweight, MatmulOperand(x_f.data(), inputs, 0),
      MatmulOperand(weight_f.data(), weights, 1), targets, n, c, v, grad_scale, chunk_rows, scratch,
      &pool_, matmul_precision_, /*bf16_logits=*/x.dtype() == DataType::kBF16);
}

void CpuBackend::ClassifierRowMax(float* max, ConstValues logits, int n, int v) {
  const FloatView logits_f(logits, static_cast<size_t>(n) * v, &pool_);
  cpu::ClassifierRowMax(max, logits_f.data(), n, v, &pool_);
}

void CpuBackend::ClassifierExpSums(Values logits, float* sums, float* target_logits,
                                   const float* max, const int32_t* targets, int n, int v,
                                   int vocab_begin) {
  FloatView logits_f(logits, static_cast<size_t>(n) * v, Access::kUpdate, &pool_);
  cpu::ClassifierExpSums(logits_f.data(), sums, target_logits, max, targets, n, v, vocab_begin,
                         &pool_);
}

void CpuBackend::ClassifierLossSum(const float* max, const float* sums, const float* target_logits,
                                   const int32_t* targets, int n, double* loss_sum) {
  *loss_sum += cpu::ClassifierLossSum(max, sums, target_logits, targets, n);
}

void CpuBackend::ClassifierLogitsBackward(Values logits, const float* sums, const int32_t* targets,
                                          int n, int v, int vocab_begin, float grad_scale) {
  FloatView logits_f(logits, static_cast<size_t>(n) * v, Access::kUpdate, &pool_);
  cpu::ClassifierLogitsBackward(logits_f.data(), sums, targets, n, v, vocab_begin, grad_scale,
                                &pool_);
}

void CpuBackend::Add(Values out, ConstValues a, ConstValues b, size_t n) {
  FloatView out_f(out, n, Access::kWrite, &pool_);
  const FloatView a_f(a, n, &pool_), b_f(b, n, &pool_);
  cpu::Add(out_f.data(), a_f.data(), b_f.data(), n, &pool_);
}

void CpuBackend::SumSquares(const float* x, size_t n, double* sum) {
  *sum += cpu::SumSquares(x, n, &pool_);
}

void CpuBackend::Scale(Values x, float factor, size_t n) {
  FloatView x_f(x, n, Access::kUpdate, &pool_);
  cpu::Scale(x_f.data(), factor, n, &pool_);
}

void CpuBackend::Zero(Values x, size_t n) {
  if (x.dtype() == DataType::kF32) return cpu::Zero(x.as<float>(), n, &pool_);
  std::memset(x.data(), 0, n * DataTypeBytes(x.dtype()));
}

void CpuBackend::Convert(Values out, ConstValues x, size_t n) { ConvertValues(out, x, n, &pool_); }

void CpuBackend::AdamW(float* param, Values param_copy, const float* grad, float* m, float* v,
                       size_t /*n: the ranges name the values*/, const AdamWRange* ranges,
                       int range_count, const AdamWStep& s) {
  const cpu::AdamWCoefficients<float> decayed = cpu::MakeAdamWCoefficients<float>(
      s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step, s.grad_scale);
  const cpu::AdamWCoefficients<float> exempt =
      cpu::MakeAdamWCoefficients<float>(s.lr, s.beta1, s.beta2, s.eps, 0, s.step, s.grad_scale);
  for (int r = 0; r < range_count; ++r) {
    const AdamWRange& range = ranges[r];
    const size_t at = range.begin, count = range.end - range.begin;
    cpu::AdamW(param + at, grad + at, m + at, v + at, count, range.decay ? decayed : exempt,
               &pool_);
    if (!param_copy.null()) Convert(param_copy + at, param + at, count);
  }
}

}  // namespace dtrain
