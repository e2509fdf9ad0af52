// The kernels a transformer step needs, behind one interface with a CPU implementation
// (OpenBLAS GEMM plus threaded loops; the reference every other path is tested against) and,
// a CUDA one. All tensors are row-major in the backend's memory; shapes are given in the comments
// as (rows, cols) with B batch, T time, C channels, V vocab, H heads, D head dim.
//
// Storage types: parameters and activations are Values (values.h), float32 or bf16; the
// arithmetic is float32 whatever they are (the CPU backend widens bf16 inputs, computes as for
// float32 and rounds its outputs to nearest even). A kernel's Values share one type, except that
// a linear layer's output may be float32 for bf16 inputs. Everything passed as float* is float32
// always: the parameter gradients (as Megatron-LM's main_grad, so that micro-batches and ranks
// add up in float32), the saved statistics (mean, rstd, lse) and the classifier's row statistics.
//
// Scalars: the loss and the squared gradient norm ADD into a double in the backend's memory
// (`double*` below), which the caller reads once a step, so that no kernel waits on the host.
//
// Gradient conventions, the same for every kernel:
//  - parameter gradients (dweight, dbias, ...) ACCUMULATE (+=): micro-batches add up;
//  - input gradients are WRITTEN (=), except the norms' dinp, which ACCUMULATES into the
//    residual stream's gradient.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/backend/cuda/adamw_math.h"
#include "core/backend/device_buffer.h"
#include "core/backend/values.h"

namespace dtrain {

// The layout of the attention input: one row per token holding H query heads, then Hkv key
// heads, then Hkv value heads, each D wide (H % Hkv == 0: grouped-query attention).
struct AttentionShape {
  int batch;     // B
  int time;      // T
  int heads;     // H
  int kv_heads;  // Hkv
  int head_dim;  // D
  int qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

using cuda::AdamWRange;

// The settings of one AdamW step.
struct AdamWStep {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  int64_t step = 0;      // 1-based, for the bias correction
  float grad_scale = 1;  // the gradient is grad * grad_scale (the mean over tokens, the clipping)
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- Memory. Every tensor below lives in memory this backend allocated. ----
  // `count` elements of `dtype`, zero-filled, aligned for vector loads. Throws std::bad_alloc
  // when the memory is not there (the caller names the phase: AllocateOrError in the trainer).
  virtual DeviceBuffer Allocate(size_t count, DataType dtype = DataType::kF32) = 0;
  // Frees what Allocate returned (DeviceBuffer's destructor calls it).
  virtual void Free(void* data) = 0;
  // Whether [data, data + bytes) lies within one live allocation of this backend (always for 0
  // bytes): what the communicators of backend memory check their buffers against, since a host
  // pointer handed to NCCL would fault on the GPU (parallel/comm/backend_memory_guard.h).
  virtual bool Holds(const void* data, size_t bytes) const = 0;
  // Copies `bytes` between this backend's memory (dst and src may not overlap), or to and from
  // host memory. Ordered after every kernel issued before them.
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* host, const void* src, size_t bytes) = 0;
  virtual void CopyFromHost(void* dst, const void* host, size_t bytes) = 0;
  // Waits until every kernel and copy issued so far has finished (the CPU backend's are done
  // when they return).
  virtual void Synchronize() = 0;

  // The memory Allocate draws from, for the trainer's check before it allocates: the machine's
  // RAM, which every rank on the machine shares (CPU), or this rank's GPU's free memory with
  // what the backend holds (CUDA).
  struct Memory {
    std::string name;  // "this machine", "GPU 3"
    double bytes = 0;
    bool shared_by_local_ranks = false;
    // The most `bytes` can be (the machine's or the GPU's whole memory; 0 = unknown): a need
    // above it is no restart's to meet, where free memory may be another process's for now.
    double capacity = 0;
  };
  virtual Memory AvailableMemory() const = 0;

  // C (M,N) = alpha * op(A) op(B) + beta * C, op = transpose when the flag is set.
  virtual void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) = 0;

  // Linear layer: out (N, OC) = inp (N, IC) @ weight (OC, IC)^T + bias (OC; may be null).
  virtual void LinearForward(Values out, ConstValues inp, ConstValues weight, ConstValues bias,
                             int n, int in_features, int out_features) = 0;
  // out (N, C) += bias (C) on every row: a row-parallel layer's bias, added once after the
  // partial outputs are summed over the tensor-parallel ranks.
  virtual void AddBias(Values out, ConstValues bias, int n, int c) = 0;
  // dinp (N, IC) = dout @ weight (may be null: not needed); dweight += dout^T @ inp;
  // dbias += column sums of dout (may be null).
  virtual void LinearBackward(Values dinp, float* dweight, float* dbias, ConstValues dout,
                              ConstValues inp, ConstValues weight, int n, int in_features,
                              int out_features) = 0;
  // GPT-2's MLP: its up-projection fused with the GELU after it, and the down-projection's
  // backward with GELU's (what cuBLASLt's GELU_AUX and DGELU epilogues compute). Forward:
  // pre (N, OC) = inp @ weight^T + bias as LinearForward, and out (N, OC) = GELU(pre) as
  // GeluForward, taken from pre's float32 sums before they are rounded to its storage type.
  virtual void LinearGeluForward(Values out, Values pre, ConstValues inp, ConstValues weight,
                                 ConstValues bias, int n, int in_features, int out_features) = 0;
  // LinearBackward of a layer whose input was GELU(pre), with dinp carried back through the
  // GELU: dpre (N, IC) = (dout @ weight) * GELU'(pre), the product in float32, rounded once.
  virtual void LinearBackwardThroughGelu(Values dpre, float* dweight, float* dbias,
                                         ConstValues dout, ConstValues inp, ConstValues pre,
                                         ConstValues weight, int n, int in_features,
                                         int out_features) = 0;

  // LayerNorm over C: out (N,C), mean (N), rstd (N) saved for backward.
  virtual void LayerNormForward(Values out, float* mean, float* rstd, ConstValues inp,
                                ConstValues weight, ConstValues bias, int n, int c, float eps) = 0;
  virtual void LayerNormBackward(Values dinp, float* dweight, float* dbias, ConstValues dout,
                                 ConstValues inp, ConstValues weight, const float* mean,
                                 const float* rstd, int n, int c) = 0;
  // The residual add fused into the norm after it: sum (N, C) = residual + inp, stored, then
  // LayerNormForward of sum as stored.
  virtual void AddLayerNormForward(Values sum, Values out, float* mean, float* rstd,
                                   ConstValues residual, ConstValues inp, ConstValues weight,
                                   ConstValues bias, int n, int c, float eps) = 0;
  // RMSNorm over C: out = inp * rstd * weight, rstd (N) saved.
  virtual void RmsNormForward(Values out, float* rstd, ConstValues inp, ConstValues weight, int n,
                              int c, float eps) = 0;
  virtual void RmsNormBackward(Values dinp, float* dweight, ConstValues dout, ConstValues inp,
                               ConstValues weight, const float* rstd, int n, int c) = 0;
  // sum (N, C) = residual + inp, stored, then RmsNormForward of sum as stored.
  virtual void AddRmsNormForward(Values sum, Values out, float* rstd, ConstValues residual,
                                 ConstValues inp, ConstValues weight, int n, int c, float eps) = 0;

  // GELU, tanh approximation (GPT-2's "gelu_new"), elementwise over n values.
  virtual void GeluForward(Values out, ConstValues inp, size_t n) = 0;
  virtual void GeluBackward(Values dinp, ConstValues inp, ConstValues dout, size_t n) = 0;
  // SwiGLU: gate_up (N, 2F) holds gate in [:, :F] and up in [:, F:]; out (N,F) = silu(gate)*up.
  virtual void SwiGluForward(Values out, ConstValues gate_up, int n, int f) = 0;
  virtual void SwiGluBackward(Values dgate_up, ConstValues gate_up, ConstValues dout, int n,
                              int f) = 0;

  // Documents packed into one row (SFT samples): `positions` (B, T), in the backend's memory as
  // the tokens are, holds each token's position in its own document, 0 at a document's first
  // token and counting up by one within it (so row t's document starts at t - positions[t]).
  // Null (pretraining): position t, one document per row. The kernels below that take it use
  // it in place of t, and attention keeps to the token's own document.

  // Rotary embedding in place on the query and key heads of qkv (B, T, qkv_width), rotating
  // the pairs (i, i + D/2) (Hugging Face Llama's rotate_half convention) by position
  // (pos_offset + t) * theta^(-2i/D). Backward rotates the gradient back, in place.
  virtual void RopeForward(Values qkv, const AttentionShape& shape, float theta, int pos_offset,
                           const int32_t* positions) = 0;
  virtual void RopeBackward(Values dqkv, const AttentionShape& shape, float theta, int pos_offset,
                            const int32_t* positions) = 0;

  // Causal self-attention with scale 1/sqrt(D): token t attends to keys [t - positions[t], t]
  // ([0, t] without positions). out (B, T, H*D); lse (B, H, T) holds each row's log-sum-exp so
  // backward recomputes the probabilities instead of storing (B,H,T,T).
  virtual void AttentionForward(Values out, float* lse, ConstValues qkv,
                                const AttentionShape& shape, const int32_t* positions) = 0;
  // dqkv (B, T, qkv_width) is written.
  virtual void AttentionBackward(Values dqkv, ConstValues dout, ConstValues qkv, ConstValues out,
                                 const float* lse, const AttentionShape& shape,
                                 const int32_t* positions) = 0;

  // out (B*T, C) = token_embedding[tokens] + position_embedding[t] (may be null). The token
  // table holds the vocabulary rows [vocab_begin, vocab_end) (all of them: [0, V)); a token
  // outside them looks up zeros (a vocabulary-parallel rank's share, summed over the ranks).
  virtual void EmbeddingForward(Values out, const int32_t* tokens, ConstValues token_embedding,
                                ConstValues position_embedding, int b, int t, int c,
                                int vocab_begin, int vocab_end, const int32_t* positions) = 0;
  // Accumulates only the rows [vocab_begin, vocab_end) of the token table.
  virtual void EmbeddingBackward(float* dtoken_embedding, float* dposition_embedding,
                                 ConstValues dout, const int32_t* tokens, int b, int t, int c,
                                 int vocab_begin, int vocab_end, const int32_t* positions) = 0;

  // Output layer fused with softmax and cross-entropy, never holding all (N, V) logits:
  // logits = x (N, C) @ weight (V, C)^T; adds the sum over rows of -log p(target) to *loss_sum.
  // Rows with target < 0 are ignored. When dx is not null, also writes dx (N, C) and accumulates
  // dweight (V, C) for the loss sum scaled by grad_scale.
  virtual void ClassifierForwardBackward(Values dx, float* dweight, ConstValues x,
                                         ConstValues weight, const int32_t* targets, int n, int c,
                                         int v, float grad_scale, double* loss_sum) = 0;

  // The same classifier split over the vocabulary (tensor parallelism), in phases between which
  // the model combines per-row statistics over the ranks. A rank holds the head's rows
  // [vocab_begin, vocab_begin + v) (v may be 0) and, per chunk of N rows, computes its logits
  // (N, v) with LinearForward, then:
  //  1. ClassifierRowMax: max (N) = each row's maximum logit (-inf when v = 0); the model takes
  //     the maximum over the ranks.
  //  2. ClassifierExpSums: logits (N, v) become exp(logit - max), sums (N) their row sums and
  //     target_logits (N) the target's logit where this rank holds it (0 elsewhere and for
  //     targets < 0); the model sums both over the ranks.
  //  3. ClassifierLossSum: adds the sum over rows of max + log(sum) - target logit, in double,
  //     rows with target < 0 ignored, to *loss_sum.
  //  4. For gradients, ClassifierLogitsBackward: the exponentials become
  //     dlogits = (exp / sum - onehot(target)) * grad_scale (0 for ignored rows), from which
  //     LinearBackward gives the rank's partial dx (summed over the ranks) and dweight.
  virtual void ClassifierRowMax(float* max, ConstValues logits, int n, int v) = 0;
  virtual void ClassifierExpSums(Values logits, float* sums, float* target_logits, const float* max,
                                 const int32_t* targets, int n, int v, int vocab_begin) = 0;
  virtual void ClassifierLossSum(const float* max, const float* sums, const float* target_logits,
                                 const int32_t* targets, int n, double* loss_sum) = 0;
  virtual void ClassifierLogitsBackward(Values logits, const float* sums, const int32_t* targets,
                                        int n, int v, int vocab_begin, float grad_scale) = 0;

  // out = a + b, elementwise.
  virtual void Add(Values out, ConstValues a, ConstValues b, size_t n) = 0;
  // Adds the sum of squares of x, accumulated in double, to *sum.
  virtual void SumSquares(const float* x, size_t n, double* sum) = 0;
  virtual void Scale(Values x, float factor, size_t n) = 0;
  virtual void Zero(Values x, size_t n) = 0;
  // out (n) = x in out's type: rounded to bf16 to nearest even (core/backend/cuda/bf16.h), or
  // widened to float32 (exact), or copied. The one place where the two types may differ.
  virtual void Convert(Values out, ConstValues x, size_t n) = 0;

  // One AdamW step (core/backend/cpu/adamw.h) on the values of `ranges` (range_count
  // AdamWRanges, ascending, in this backend's memory) among n: the float32 masters `param`, the
  // moments m and v, from grad * grad_scale, with bias correction and decoupled weight decay
  // where a range has decay: p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p). Every
  // tensor of a parameter unit in one call (one kernel on the GPU). param_copy, when not null
  // (bf16), gets each updated value rounded: the compute copy the forward reads.
  virtual void AdamW(float* param, Values param_copy, const float* grad, float* m, float* v,
                     size_t n, const AdamWRange* ranges, int range_count,
                     const AdamWStep& step) = 0;
};

// Rows of logits a classifier computes at once for a vocabulary (or a rank's vocabulary slot) of
// v columns, so that the (N, V) matrix never exists whole: as many as fit in `budget_bytes` of
// logits of `value_bytes` each, a multiple of 64 and at least 128, since the weight-gradient GEMM,
// whose inner dimension is the chunk, runs at half speed with 128 rows and near peak from about
// 512 (measured with OpenBLAS at V = 50257, C = 768). The default, 128 MiB of float32, is the CPU
// backend's fused classifier's and every backend's vocabulary-parallel phases' (a function of v
// only, so every tensor-parallel rank cuts alike); GpuClassifierChunkRows is the CUDA backend's
// fused classifier's. The memory estimates count one chunk.
inline constexpr size_t kClassifierChunkBytes = size_t{128} << 20;
inline int ClassifierChunkRows(int v, size_t budget_bytes = kClassifierChunkBytes,
                               size_t value_bytes = sizeof(float)) {
  const size_t rows = budget_bytes / value_bytes / static_cast<size_t>(std::max(v, 1));
  if (rows >= (size_t{1} << 30)) return 1 << 30;
  return std::max(128, static_cast<int>(rows / 64 * 64));
}

// On a GPU, 1 GiB of logits in their own type: each chunk's weight-gradient GEMM reads and writes
// the whole float32 gradient of the head (154 MB for GPT-2 124M), so 128 MiB chunks (640 rows)
// moved 8 GB a step of 16 x 1024 tokens; at 1 GiB of bf16 they are 10,624 rows and move 0.6 GB
// (llm.c computes every row at once).
// Its rows lie GpuLogitsStride(v) values apart, 16 bytes apart whatever V, for cuBLASLt.
inline constexpr size_t kGpuClassifierChunkBytes = size_t{1} << 30;
inline int GpuLogitsStride(int v) { return (v + 7) / 8 * 8; }
inline int GpuClassifierChunkRows(int v, size_t value_bytes) {
  return ClassifierChunkRows(GpuLogitsStride(v), kGpuClassifierChunkBytes, value_bytes);
}

// A scalar of the kind above, one double in `backend`'s memory: its value (waiting for the
// kernels before), and set to 0 (all zero bits, as a double and as two floats).
inline double ReadScalar(Backend& backend, const double* scalar) {
  double value = 0;
  backend.CopyToHost(&value, scalar, sizeof(value));
  return value;
}
inline void ZeroScalar(Backend& backend, double* scalar) {
  backend.Zero(reinterpret_cast<float*>(scalar), sizeof(double) / sizeof(float));
}

}  // namespace dtrain
