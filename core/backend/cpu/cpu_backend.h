// The CPU backend: OpenBLAS GEMMs plus loops threaded on one ThreadPool. Every method forwards
// to the float instantiation of a kernel template in this folder (the double instantiation is
// what the tests finite-difference). Below matmul precision highest, the linear layers' and the
// classifier's GEMMs multiply their inputs rounded as tensor cores round them
// (matmul_precision.h). Bf16 Values are the reference for the GPU's: widened into float32 copies,
// computed on as float32, and the outputs rounded back to nearest even. Not thread-safe: one
// caller at a time, since the pool and the scratch buffers are shared by all calls.
#pragma once

#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/backend/allocations.h"
#include "core/backend/backend.h"
#include "core/backend/matmul_precision.h"
#include "core/util/thread_pool.h"

namespace dtrain {

class CpuBackend : public Backend {
 public:
  // num_threads <= 0 means one per hardware thread.
  explicit CpuBackend(int num_threads,
                      MatmulPrecision matmul_precision = MatmulPrecision::kHighest);
  ~CpuBackend() override;

  int num_threads() const { return pool_.size(); }

  DeviceBuffer Allocate(size_t count, DataType dtype) override;
  void Free(void* data) override;
  bool Holds(const void* data, size_t bytes) const override {
    return allocations_.Holds(data, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* host, const void* src, size_t bytes) override;
  void CopyFromHost(void* dst, const void* host, size_t bytes) override;
  void Synchronize() override {}
  Memory AvailableMemory() const override { return MachineMemory(); }
  // This machine's physical memory, which its ranks share.
  static Memory MachineMemory();

  void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override;

  void LinearForward(Values out, ConstValues inp, ConstValues weight, ConstValues bias, int n,
                     int in_features, int out_features) override;
  void AddBias(Values out, ConstValues bias, int n, int c) override;
  void LinearBackward(Values dinp, float* dweight, float* dbias, ConstValues dout, ConstValues inp,
                      ConstValues weight, int n, int in_features, int out_features) override;
  void LinearGeluForward(Values out, Values pre, ConstValues inp, ConstValues weight,
                         ConstValues bias, int n, int in_features, int out_features) override;
  void LinearBackwardThroughGelu(Values dpre, float* dweight, float* dbias, ConstValues dout,
                                 ConstValues inp, ConstValues pre, ConstValues weight, int n,
                                 int in_features, int out_features) override;

  void LayerNormForward(Values out, float* mean, float* rstd, ConstValues inp, ConstValues weight,
                        ConstValues bias, int n, int c, float eps) override;
  void LayerNormBackward(Values dinp, float* dweight, float* dbias, ConstValues dout,
                         ConstValues inp, ConstValues weight, const float* mean, const float* rstd,
                         int n, int c) override;
  void AddLayerNormForward(Values sum, Values out, float* mean, float* rstd, ConstValues residual,
                           ConstValues inp, ConstValues weight, ConstValues bias, int n, int c,
                           float eps) override;
  void RmsNormForward(Values out, float* rstd, ConstValues inp, ConstValues weight, int n, int c,
                      float eps) override;
  void AddRmsNormForward(Values sum, Values out, float* rstd, ConstValues residual, ConstValues inp,
                         ConstValues weight, int n, int c, float eps) override;
  void RmsNormBackward(Values dinp, float* dweight, ConstValues dout, ConstValues inp,
                       ConstValues weight, const float* rstd, int n, int c) override;

  void GeluForward(Values out, ConstValues inp, size_t n) override;
  void GeluBackward(Values dinp, ConstValues inp, ConstValues dout, size_t n) override;
  void SwiGluForward(Values out, ConstValues gate_up, int n, int f) override;
  void SwiGluBackward(Values dgate_up, ConstValues gate_up, ConstValues dout, int n,
                      int f) override;

  void RopeForward(Values qkv, const AttentionShape& shape, float theta, int pos_offset,
                   const int32_t* positions) override;
  void RopeBackward(Values dqkv, const AttentionShape& shape, float theta, int pos_offset,
                    const int32_t* positions) override;

  void AttentionForward(Values out, float* lse, ConstValues qkv, const AttentionShape& shape,
                        const int32_t* positions) override;
  void AttentionBackward(Values dqkv, ConstValues dout, ConstValues qkv, ConstValues out,
                         const float* lse, const AttentionShape& shape,
                         const int32_t* positions) override;

  void EmbeddingForward(Values out, const int32_t* tokens, ConstValues token_embedding,
                        ConstValues position_embedding, int b, int t, int c, int vocab_begin,
                        int vocab_end, const int32_t* positions) override;
  void EmbeddingBackward(float* dtoken_embedding, float* dposition_embedding, ConstValues dout,
                         const int32_t* tokens, int b, int t, int c, int vocab_begin, int vocab_end,
                         const int32_t* positions) override;

  void ClassifierForwardBackward(Values dx, float* dweight, ConstValues x, ConstValues weight,
                                 const int32_t* targets, int n, int c, int v, float grad_scale,
                                 double* loss_sum) override;
  void ClassifierRowMax(float* max, ConstValues logits, int n, int v) override;
  void ClassifierExpSums(Values logits, float* sums, float* target_logits, const float* max,
                         const int32_t* targets, int n, int v, int vocab_begin) override;
  void ClassifierLossSum(const float* max, const float* sums, const float* target_logits,
                         const int32_t* targets, int n, double* loss_sum) override;
  void ClassifierLogitsBackward(Values logits, const float* sums, const int32_t* targets, int n,
                                int v, int vocab_begin, float grad_scale) override;

  void Add(Values out, ConstValues a, ConstValues b, size_t n) override;
  void SumSquares(const float* x, size_t n, double* sum) override;
  void Scale(Values x, float factor, size_t n) override;
  void Zero(Values x, size_t n) override;
  void Convert(Values out, ConstValues x, size_t n) override;

  void AdamW(float* param, Values param_copy, const float* grad, float* m, float* v, size_t n,
             const AdamWRange* ranges, int range_count, const AdamWStep& step) override;

 private:
  // Grows the shared scratch to at least `size` values and returns it.
  float* Scratch(size_t size);
  // The GEMM input x (count values) as matmul_precision_ has it multiplied: x itself at highest,
  // else rounded into operand scratch `slot` (0-2: a GEMM call's operands at once).
  const float* MatmulOperand(const float* x, size_t count, int slot);
  // LinearForward and LinearBackward writing float32 outputs (their Values' views).
  void LinearInto(float* out, ConstValues inp, ConstValues weight, ConstValues bias, int n,
                  int in_features, int out_features);
  void LinearBackwardInto(float* dinp, float* dweight, float* dbias, ConstValues dout,
                          ConstValues inp, ConstValues weight, int n, int in_features,
                          int out_features);

  ThreadPool pool_;
  MatmulPrecision matmul_precision_;
  Allocations allocations_;
  // Freed blocks of at least kCachedBlockBytes, kept for the next Allocate of their size (up to
  // kMaxCachedBytes in all). The engine's unit buffers (gathered parameters, gradient shards and
  // their bf16 wires) come and go every step at the same sizes; handed back to glibc, whose heap
  // takes them once its dynamic mmap threshold has risen, they fragment it: ZeRO-2's peak RSS grew
  // 6% over 15 steps of a 10.8M model on 2 ranks, FSDP's settled 17% above what it needs.
  std::mutex cache_mu_;
  std::unordered_multimap<size_t, void*> cached_;  // bytes -> block
  size_t cached_bytes_ = 0;
  std::vector<float> operands_[3];
  // Attention's per-thread score blocks and the classifier's logits chunk; kept between calls
  // so a step does not reallocate tens of MB.
  std::vector<float> scratch_;
};

}  // namespace dtrain
