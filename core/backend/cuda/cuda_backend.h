// The CUDA backend: tensors in device memory of one GPU, every kernel on one compute stream.
// GEMMs (and the linear layers, the bias and GPT-2's GELU fused as cuBLASLt's epilogues) run
// through cuBLASLt with one workspace and fp32 sums, their inputs bf16, or float32 (TF32 off) or,
// at run.matmul_precision high or medium, float32 rounded to TF32 or bf16 on the tensor cores
// (matmul_precision.h), so that float32 results stay within 1e-4 of the CPU backend's at the same
// precision; everything else runs the kernels of this folder (kernels.h), instantiated for the
// Values' storage type, float or bf16. Built into the CUDA module (cuda_module.h), never into the
// binary.
//
// Memory: Allocate is cudaMallocAsync on the stream from the device's pool, which keeps freed
// memory for reuse, zero-filled on the stream; Free returns it on the stream without waiting (on
// a device without pools, cudaMalloc and cudaFree).
// Running out (after giving the pool's free blocks back to the driver) throws OutOfMemory
// (core/util/allocate.h) naming the bytes asked and free, which AllocateOrError reports with the
// phase. Copies and kernels are asynchronous on the stream, the loss and the sums of squares
// included (they add into device doubles), and so are copies from the host of up to 1 MiB (the
// micro-batches' token ids, targets and positions: through pinned staging slots); CopyToHost
// and larger copies from the host wait for it. A failed CUDA call or kernel is kept as
// status(), naming it. Not thread-safe; every call comes from the thread that created it (whose
// current device it set).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/backend/allocations.h"
#include "core/backend/backend.h"
#include "core/backend/cuda/norm_math.h"
#include "core/backend/matmul_precision.h"

namespace dtrain {

class CudaBackend : public Backend {
 public:
  // The backend on GPU `device` (a local rank: one worker per GPU). FailedPrecondition when there
  // is no GPU (no driver, none visible) or fewer than device + 1, saying which.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      int device, MatmulPrecision matmul_precision = MatmulPrecision::kHighest);
  // Create's check, without starting the GPU.
  static absl::Status CheckDevice(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  int device() const { return device_; }
  Memory AvailableMemory() const override;
  cudaStream_t stream() const { return stream_; }

  DeviceBuffer Allocate(size_t count, DataType dtype) override;
  void Free(void* data) override;
  bool Holds(const void* data, size_t bytes) const override {
    return allocations_.Holds(data, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* host, const void* src, size_t bytes) override;
  void CopyFromHost(void* dst, const void* host, size_t bytes) override;
  void Synchronize() override;
  // The first failed CUDA call or kernel since Create, naming it, or OK. Kernels run
  // asynchronously, so callers check it where they can report it (the trainer: every step).
  absl::Status status() const { return first_error_; }

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
  CudaBackend(int device, cudaStream_t stream, cublasLtHandle_t lt, cudaMemPool_t pool,
              MatmulPrecision matmul_precision);

  // Releases the pinned staging slots: copies from the host then wait for the stream.
  void FreeStaging();
  // Keeps the first failure as status(), naming `what` (a kernel or CUDA call).
  void Check(cudaError_t error, absl::string_view what);
  void CheckBlas(cublasStatus_t status, const char* what);
  // After launching kernel `kernel`: a launch error (bad configuration, an earlier fault).
  void CheckLaunch(const char* kernel) { Check(cudaGetLastError(), kernel); }
  // Row-major C (M, N) = alpha op(A) op(B) + beta C (+ bias (N) on every row when not null,
  // cuBLASLt's bias epilogue), as Backend::Gemm. A and B share a storage type; C may be float32
  // for bf16 inputs. Float32 inputs multiply at run.matmul_precision, or in float32 when
  // `exact` (the GEMMs with a vector of ones that add and sum biases).
  //
  // With `gelu`, cuBLASLt's GELU epilogues act on C as laid out: kForward makes C the GELU of
  // the sums (bias included) and writes the sums to gelu->input (GELU_AUX); kBackward multiplies
  // the sums by GELU' at gelu->input (DGELU). False, with nothing run, when cuBLASLt has no
  // algorithm for them (C's row length not a multiple of 8, as the epilogue's buffer needs, or
  // no kernel for the types): the caller runs the GEMM and the GELU kernel apart.
  struct GeluEpilogue {
    enum class Pass { kForward, kBackward } pass;
    ConstValues input;  // laid out as C, of its type; written in kForward
  };
  bool Matmul(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, ConstValues a,
              int lda, ConstValues b, int ldb, float beta, Values c, int ldc, ConstValues bias,
              bool exact = false, const GeluEpilogue* gelu = nullptr);
  // `buffer` holding at least `count` values of `dtype` (reallocated, contents lost, when smaller
  // or of another type).
  Values Scratch(DeviceBuffer& buffer, size_t count, DataType dtype);
  // The norms' scratch for their parameter gradients' slice sums (cuda::ColumnSlices(n) x c).
  cuda::ColumnGrads* ColumnSliceSums(int n, int c);
  // n ones (N) of `dtype`, for the bias sums and adds as GEMMs with a vector of ones.
  ConstValues Ones(size_t n, DataType dtype);
  // Calls launch(T{}) with T the storage type of the non-null `values` (float or cuda::Bf16), then
  // checks the launch of `kernel`; values of mixed or other types are kept as status() naming
  // it (a caller's bug), launching nothing.
  template <typename Launch>
  void LaunchTyped(const char* kernel, std::initializer_list<ConstValues> values,
                   const Launch& launch);

  int device_;
  cudaStream_t stream_;
  cublasLtHandle_t lt_;
  cudaMemPool_t pool_;  // the device's default pool, which Allocate draws from; null: none
  MatmulPrecision matmul_precision_;
  Allocations allocations_;  // before the buffers below, which free into it
  // The backend's own buffers, one struct so that the destructor frees every one of them on the
  // stream before it destroys the stream.
  struct OwnBuffers {
    DeviceBuffer workspace;       // cuBLASLt's, kWorkspaceBytes
    DeviceBuffer ones;            // 1.0f each
    DeviceBuffer ones_bf16;       // 1.0 each in bf16
    DeviceBuffer logits;          // the classifier's (chunk, V) logits, in its inputs' type
    DeviceBuffer losses;          // (N) the classifier's per-row losses
    DeviceBuffer block_sums;      // SumSquares's per-block sums
    DeviceBuffer column_sums;     // the norms' parameter gradients' slice sums
    DeviceBuffer embedding_sort;  // EmbeddingBackward's ids sorted with their rows
    DeviceBuffer deltas;          // AttentionBackward's (B, H, T) rows' dout . out
  };
  OwnBuffers own_;
  // CopyFromHost's pinned slots, used in turn; `copied` is recorded after the copy out of one.
  struct StagingSlot {
    void* pinned = nullptr;
    cudaEvent_t copied = nullptr;
  };
  std::vector<StagingSlot> staging_;
  size_t next_slot_ = 0;
  absl::Status first_error_;
};

}  // namespace dtrain
