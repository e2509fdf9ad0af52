// Launchers of the CUDA kernels (core/backend/cuda/*.cu), for T = float or Bf16 storage: each
// enqueues its kernel on `stream` and returns without waiting; pointers are device memory and the
// shapes are the CPU backend's (core/backend/backend.h), `positions` (B, T) included: documents
// packed into the rows, or null (positions_math.h). Arithmetic is fp32 whatever T is; each
// kernel's per-element or per-row arithmetic is the DTRAIN_HD function of the *_math.h header
// named beside it, which the tests run on the host against the CPU backend. Launch errors are
// left for the caller's cudaGetLastError, as with any kernel launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/backend/backend.h"
#include "core/backend/cuda/adamw_math.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/elementwise_math.h"
#include "core/backend/cuda/norm_math.h"

namespace dtrain::cuda {

// activation_math.h. out, inp, dinp, dout (n); gate_up, dgate_up (N, 2F); swiglu out (N, F).
template <typename T>
void GeluForward(T* out, const T* inp, size_t n, cudaStream_t stream);
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream);
template <typename T>
void SwiGluForward(T* out, const T* gate_up, int n, int f, cudaStream_t stream);
template <typename T>
void SwiGluBackward(T* dgate_up, const T* gate_up, const T* dout, int n, int f,
                    cudaStream_t stream);

// norm_math.h, one warp per row. out, inp (N, C); mean, rstd (N) fp32; weight, bias (C). With
// residual (N, C) not null, the row normalised is residual + inp, also written to residual_out.
// dinp (N, C) +=, dweight, dbias (C) fp32 +=; inp there is the normalised x (residual_out if
// fused); slice_sums is scratch for ColumnSlices(n) x C ColumnGrads.
template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, T* residual_out, const T* residual,
                      const T* inp, const T* weight, const T* bias, int n, int c, float eps,
                      cudaStream_t stream);
template <typename T>
void LayerNormBackward(T* dinp, float* dweight, float* dbias, ColumnGrads* slice_sums,
                       const T* dout, const T* inp, const T* weight, const float* mean,
                       const float* rstd, int n, int c, cudaStream_t stream);
template <typename T>
void RmsNormForward(T* out, float* rstd, T* residual_out, const T* residual, const T* inp,
                    const T* weight, int n, int c, float eps, cudaStream_t stream);
template <typename T>
void RmsNormBackward(T* dinp, float* dweight, ColumnGrads* slice_sums, const T* dout, const T* inp,
                     const T* weight, const float* rstd, int n, int c, cudaStream_t stream);

// classifier_math.h, one block per row, after the logits GEMM: logits (N, V), rows `ld` >= V
// apart (16-byte loads wherever a row starts: RowPacks), become dlogits when
// write_gradient (0 for targets < 0); losses (N) fp32 get each row's -log p(target) (0 when
// ignored), to be summed by the caller.
template <typename T>
void ClassifierSoftmaxCrossEntropy(T* logits, int ld, float* losses, const int32_t* targets, int n,
                                   int v, float grad_scale, bool write_gradient,
                                   cudaStream_t stream);
// The vocabulary-parallel phases (Backend::ClassifierRowMax ... ClassifierLogitsBackward), a
// rank's logits (N, v) one block per row; max, sums, target_logits (N) fp32. VocabLosses writes
// each row's loss into losses (N), one thread per row, for the caller's AddSum.
template <typename T>
void VocabRowMax(float* max, const T* logits, int n, int v, cudaStream_t stream);
template <typename T>
void VocabExpSums(T* logits, float* sums, float* target_logits, const float* max,
                  const int32_t* targets, int n, int v, int vocab_begin, cudaStream_t stream);
void VocabLosses(float* losses, const float* max, const float* sums, const float* target_logits,
                 const int32_t* targets, int n, cudaStream_t stream);
template <typename T>
void VocabLogitsBackward(T* logits, const float* sums, const int32_t* targets, int n, int v,
                         int vocab_begin, float grad_scale, cudaStream_t stream);

// adamw_math.h, over the `count` ranges (device memory) of n values: param, m, v, grad (n) fp32
// masters, moments and gradients; param_copy (n) gets the updated values in bf16 when not null.
// k from cpu::MakeAdamWCoefficients<float>.
void AdamW(float* param, Bf16* param_copy, const float* grad, float* m, float* v, size_t n,
           const AdamWRange* ranges, int count, const AdamWCoefficients& k, cudaStream_t stream);

// rope_math.h, one thread per rotated pair: qkv, dqkv (B, T, qkv_width) in place, the query and
// key heads of each row rotated (backward: rotated back).
template <typename T>
void RopeForward(T* qkv, const AttentionShape& shape, double theta, int pos_offset,
                 const int32_t* positions, cudaStream_t stream);
template <typename T>
void RopeBackward(T* dqkv, const AttentionShape& shape, double theta, int pos_offset,
                  const int32_t* positions, cudaStream_t stream);

// embedding_math.h. tokens (B, T); token_embedding (vocab_end - vocab_begin, C); position_embedding
// (maxT, C) or null; out (B*T, C). Forward: one thread per 16-byte pack of out. Backward: the
// fp32 gradient tables += (the position table skipped when null): the ids sorted with their rows
// (CUB's stable radix sort) into `scratch`, EmbeddingBackwardScratchBytes(B*T) bytes of device
// memory, then one thread per (run of an id, column); without documents the position table one
// thread per (position, column). Returns the sort's error if it failed to start (the kernels' show
// as launch errors).
size_t EmbeddingBackwardScratchBytes(size_t rows);
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* token_embedding,
                      const T* position_embedding, int b, int t, int c, int vocab_begin,
                      int vocab_end, const int32_t* positions, cudaStream_t stream);
template <typename T>
cudaError_t EmbeddingBackward(float* dtoken_embedding, float* dposition_embedding, const T* dout,
                              const int32_t* tokens, int b, int t, int c, int vocab_begin,
                              int vocab_end, const int32_t* positions, void* scratch,
                              cudaStream_t stream);

// elementwise_math.h. out = a + b (n). *sum_squares (one double, device memory) += the sum of
// squares of x (n); block_sums: scratch of SumSquaresBlocks(n) floats. AddSum: *total (one
// double) += the sum of values (n) in double, one block. Scale: x (n) *= factor.
template <typename T>
void Add(T* out, const T* a, const T* b, size_t n, cudaStream_t stream);
template <typename T>
void SumSquares(double* sum_squares, float* block_sums, const T* x, size_t n, cudaStream_t stream);
void AddSum(double* total, const float* values, size_t n, cudaStream_t stream);
template <typename T>
void Scale(T* x, float factor, size_t n, cudaStream_t stream);
// out (n) = x as To (bf16.h's FromFloat: to nearest even into bf16), one thread per value.
template <typename To, typename From>
void Convert(To* out, const From* x, size_t n, cudaStream_t stream);

// attention_math.h, tiled (attention.cu); bf16 with head_dim 64 or 128 on tensor cores
// (flash_attention_math.h) on sm_80 and later. qkv, dqkv (B, T, qkv_width); out, dout (B, T,
// H*D); lse (B, H, T) fp32; deltas (B, H, T) fp32 scratch, where the tensor-core backward keeps
// each row's dout . out between its two kernels. Backward writes dqkv whole. cudaErrorInvalidValue,
// launching nothing, when head_dim exceeds kAttentionMaxHeadDim or H is not a multiple of Hkv.
template <typename T>
cudaError_t AttentionForward(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                             const int32_t* positions, cudaStream_t stream);
template <typename T>
cudaError_t AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              float* deltas, const AttentionShape& shape, const int32_t* positions,
                              cudaStream_t stream);

}  // namespace dtrain::cuda
