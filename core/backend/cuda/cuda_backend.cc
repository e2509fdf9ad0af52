#include "core/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/backend/cpu/adamw.h"
#include "core/backend/cuda/attention_math.h"
#include "core/backend/cuda/elementwise_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/util/allocate.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// cuBLASLt's workspace: 32 MiB is what its heuristics use for the largest GEMMs on sm_90.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Pinned staging for CopyFromHost: slots of 1 MiB (a micro-batch's token ids, targets and
// positions up to 256K tokens), 8 of them, so that a slot comes round again only after the
// copies of two more micro-batches were issued.
constexpr size_t kStagingSlotBytes = size_t{1} << 20;
constexpr int kStagingSlots = 8;

// The largest power of two dividing `pointer`'s address, up to cuBLASLt's default assumption of
// 256: views into the arena or the flat parameters are often only 4-byte aligned (2-byte in
// bf16), and the heuristic must not pick a kernel that needs more.
uint32_t Alignment(const void* pointer) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

std::string GiB(size_t bytes) {
  return absl::StrFormat("%.3f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace

absl::Status CudaBackend::CheckDevice(int device) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  // A driver (version 0: none) older than the runtime this binary was built with.
  int driver = 0, runtime = 0;
  if (counted == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
      driver > 0 && cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    const auto version = [](int v) { return absl::StrCat(v / 1000, ".", v % 1000 / 10); };
    return absl::FailedPreconditionError(absl::StrCat(
        "run.device is cuda but the NVIDIA driver supports CUDA ", version(driver),
        " and this dtrain was built with the CUDA ", version(runtime),
        " runtime: update the driver (nvidia-smi shows its version), or build dtrain with a "
        "CUDA toolkit no newer than ",
        version(driver)));
  }
  if (counted != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run.device is cuda but no GPU was found: the CUDA runtime says \"",
        counted != cudaSuccess ? cudaGetErrorString(counted) : "0 devices",
        "\" (no NVIDIA driver, or no GPU visible: see nvidia-smi and CUDA_VISIBLE_DEVICES); run on "
        "a GPU machine, or set run.device: cpu"));
  }
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("local rank ", device, " needs GPU ", device, " but ", count,
                     " GPU(s) are visible on this node; start at most one worker per GPU "
                     "(dtrain launch --nproc-per-node gpu)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device,
                                                                 MatmulPrecision matmul_precision) {
  RETURN_IF_ERROR(CheckDevice(device));
  cudaError_t error = cudaSetDevice(device);
  cudaStream_t stream = nullptr;
  if (error == cudaSuccess) error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start GPU ", device, ": ", cudaGetErrorString(error)));
  }
  cublasLtHandle_t lt = nullptr;
  if (const cublasStatus_t status = cublasLtCreate(&lt); status != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return absl::FailedPreconditionError(absl::StrCat("cannot start cuBLASLt on GPU ", device, ": ",
                                                      cublasLtGetStatusString(status)));
  }
  // Allocate draws from the device's stream-ordered pool, which keeps what is freed for the next
  // allocation (as PyTorch's caching allocator) instead of returning it to the driver. A device
  // or driver without pools (some virtualised ones) allocates with cudaMalloc instead.
  cudaMemPool_t pool = nullptr;
  int pools_supported = 0;
  error = cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, device);
  if (error == cudaSuccess && pools_supported != 0) {
    uint64_t keep_everything = UINT64_MAX;
    error = cudaDeviceGetDefaultMemPool(&pool, device);
    if (error == cudaSuccess) {
      error = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything);
    }
  }
  if (error != cudaSuccess) {
    cublasLtDestroy(lt);
    cudaStreamDestroy(stream);
    return absl::FailedPreconditionError(absl::StrCat("cannot set up the memory pool of GPU ",
                                                      device, ": ", cudaGetErrorString(error)));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(device, stream, lt, pool, matmul_precision));
  try {
    backend->own_.workspace = backend->Allocate(kWorkspaceBytes / sizeof(float), DataType::kF32);
  } catch (const OutOfMemory& oom) {
    if (!backend->first_error_.ok()) return backend->first_error_;  // a fault, not a shortage
    return absl::ResourceExhaustedError(absl::StrCat("cuBLASLt's workspace: ", oom.what()));
  }
  // Without pinned memory (a locked-memory limit), every copy from the host waits for the stream.
  backend->staging_.resize(kStagingSlots);
  for (StagingSlot& slot : backend->staging_) {
    if (cudaHostAlloc(&slot.pinned, kStagingSlotBytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      slot.pinned = nullptr;
      break;
    }
    backend->Check(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming),
                   "cudaEventCreate (staging)");
  }
  if (backend->staging_.back().pinned == nullptr) backend->FreeStaging();
  if (!backend->first_error_.ok()) return backend->first_error_;
  return backend;
}

CudaBackend::CudaBackend(int device, cudaStream_t stream, cublasLtHandle_t lt, cudaMemPool_t pool,
                         MatmulPrecision matmul_precision)
    : device_(device), stream_(stream), lt_(lt), pool_(pool), matmul_precision_(matmul_precision) {}

Backend::Memory CudaBackend::AvailableMemory() const {
  // The GPU's free memory now and what this backend's pool holds (in use or kept for reuse):
  // what the CUDA context, the communicators' buffers (created before the model) and other
  // processes took is not the model's.
  size_t free_bytes = 0, total_bytes = 0;
  uint64_t pooled = 0;
  const bool known =
      cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess &&
      (pool_ == nullptr ||
       cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &pooled) == cudaSuccess);
  // A failed query is left for the allocations to report, not for the next kernel launch's
  // cudaGetLastError to take for its own.
  if (!known) cudaGetLastError();
  return {.name = absl::StrCat("GPU ", device_),
          .bytes = known ? static_cast<double>(free_bytes) + static_cast<double>(pooled)
                         : std::numeric_limits<double>::infinity(),
          .shared_by_local_ranks = false,
          .capacity = known ? static_cast<double>(total_bytes) : 0};
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  // The buffers free on the stream, so before it goes.
  own_ = OwnBuffers{};
  FreeStaging();
  cublasLtDestroy(lt_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::FreeStaging() {
  for (const StagingSlot& slot : staging_) {
    if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
    if (slot.pinned != nullptr) cudaFreeHost(slot.pinned);
  }
  staging_.clear();
}

void CudaBackend::Check(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess || !first_error_.ok()) return;
  first_error_ = absl::InternalError(absl::StrCat(
      "CUDA error in ", what, " on GPU ", device_, ": ", cudaGetErrorString(error),
      " (kernels run asynchronously: an error may surface in a later call; CUDA_LAUNCH_BLOCKING=1 "
      "names the kernel that caused it)"));
}

void CudaBackend::CheckBlas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS || !first_error_.ok()) return;
  first_error_ = absl::InternalError(absl::StrCat("cuBLASLt error in ", what, " on GPU ", device_,
                                                  ": ", cublasLtGetStatusString(status)));
}

DeviceBuffer CudaBackend::Allocate(size_t count, DataType dtype) {
  const size_t bytes = count * DataTypeBytes(dtype);
  void* data = nullptr;
  cudaError_t failure = cudaSuccess;
  const auto allocate = [&] {
    failure = pool_ == nullptr ? cudaMalloc(&data, std::max<size_t>(bytes, 1))
                               : cudaMallocAsync(&data, std::max<size_t>(bytes, 1), stream_);
    if (failure == cudaSuccess) return true;
    cudaGetLastError();  // an allocation failure is not sticky: clear it
    return false;
  };
  bool allocated = allocate();
  if (!allocated && failure == cudaErrorMemoryAllocation && pool_ != nullptr) {
    // The pool may hold freed blocks too small or fragmented for this one: once the frees
    // issued so far have run, give them back to the driver and ask again.
    Synchronize();
    cudaMemPoolTrimTo(pool_, 0);
    allocated = allocate();
  }
  if (!allocated && failure != cudaErrorMemoryAllocation) {
    // Not a shortage: an earlier kernel's fault (sticky) or the allocator's own. status() names
    // it, which the trainer reports before the phase's shortage.
    Check(failure, pool_ == nullptr ? "cudaMalloc" : "cudaMallocAsync");
    throw OutOfMemory(absl::StrCat("allocating ", bytes, " bytes on GPU ", device_,
                                   " failed with \"", cudaGetErrorString(failure),
                                   "\", not for want of memory"));
  }
  if (!allocated) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw OutOfMemory(absl::StrCat("allocating ", bytes, " bytes (", GiB(bytes), ") on GPU ",
                                   device_, " with ", GiB(free_bytes), " free of ",
                                   GiB(total_bytes)));
  }
  Check(cudaMemsetAsync(data, 0, bytes, stream_), "cudaMemsetAsync (Allocate)");
  allocations_.Add(data, bytes);
  return DeviceBuffer(this, data, count, dtype);
}

void CudaBackend::Free(void* data) {
  // Back to the pool once the kernels and copies issued on the stream so far have run (the
  // communicators' operations on it were waited for by then), without waiting here; cudaFree
  // (without a pool) waits for the device.
  allocations_.Remove(data);
  if (pool_ == nullptr) {
    Check(cudaFree(data), "cudaFree");
  } else {
    Check(cudaFreeAsync(data, stream_), "cudaFreeAsync");
  }
}

void CudaBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "Copy");
}

void CudaBackend::CopyToHost(void* host, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_), "CopyToHost");
  Synchronize();
}

void CudaBackend::CopyFromHost(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return;
  if (bytes > kStagingSlotBytes || staging_.empty()) {
    Check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_), "CopyFromHost");
    // The host memory may be reused as soon as this returns.
    Synchronize();
    return;
  }
  // Through the next pinned slot, without waiting for the stream: the host's bytes are in the
  // slot when this returns, and the slot is reused only once the copy out of it has run (an
  // event never recorded counts as done).
  StagingSlot& slot = staging_[next_slot_];
  next_slot_ = (next_slot_ + 1) % staging_.size();
  Check(cudaEventSynchronize(slot.copied), "the copy out of a staging slot");
  std::memcpy(slot.pinned, host, bytes);
  Check(cudaMemcpyAsync(dst, slot.pinned, bytes, cudaMemcpyHostToDevice, stream_), "CopyFromHost");
  Check(cudaEventRecord(slot.copied, stream_), "cudaEventRecord (staging)");
}

void CudaBackend::Synchronize() {
  Check(cudaStreamSynchronize(stream_), "the kernels before a synchronisation");
}

Values CudaBackend::Scratch(DeviceBuffer& buffer, size_t count, DataType dtype) {
  if (buffer.size() < count || buffer.dtype() != dtype) buffer = Allocate(count, dtype);
  return buffer.values();
}

cuda::ColumnGrads* CudaBackend::ColumnSliceSums(int n, int c) {
  static_assert(sizeof(cuda::ColumnGrads) == 2 * sizeof(float));
  const size_t floats = 2 * static_cast<size_t>(cuda::ColumnSlices(n)) * c;
  return reinterpret_cast<cuda::ColumnGrads*>(
      Scratch(own_.column_sums, floats, DataType::kF32).data());
}

ConstValues CudaBackend::Ones(size_t n, DataType dtype) {
  DeviceBuffer& ones = dtype == DataType::kBF16 ? own_.ones_bf16 : own_.ones;
  if (ones.size() < n) {
    ones = Allocate(n, dtype);
    const std::vector<float> host(n, 1.0f);
    DeviceBuffer staged = Allocate(n, DataType::kF32);
    CopyFromHost(staged.data(), host.data(), n * sizeof(float));
    Convert(ones.values(), staged.values(), n);
  }
  return ones.values();
}

template <typename Launch>
void CudaBackend::LaunchTyped(const char* kernel, std::initializer_list<ConstValues> values,
                              const Launch& launch) {
  std::optional<DataType> type;
  for (const ConstValues& v : values) {
    if (v.null()) continue;
    if (type.has_value() && *type != v.dtype()) {
      return Check(cudaErrorInvalidValue, absl::StrCat(kernel, " (its tensors mix storage types)"));
    }
    type = v.dtype();
  }
  if (type == DataType::kBF16) {
    launch(cuda::Bf16{});
  } else if (!type.has_value() || type == DataType::kF32) {
    launch(float{});
  } else {
    return Check(cudaErrorInvalidValue,
                 absl::StrCat(kernel, " (values of type ", DataTypeName(*type), ")"));
  }
  CheckLaunch(kernel);
}

namespace {
cudaDataType_t CudaType(DataType dtype) {
  return dtype == DataType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}
}  // namespace

bool CudaBackend::Matmul(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                         ConstValues a, int lda, ConstValues b, int ldb, float beta, Values c,
                         int ldc, ConstValues bias, bool exact, const GeluEpilogue* gelu) {
  if (m == 0 || n == 0) return true;
  // The epilogue's buffer is laid out as C, whose rows (cuBLASLt's columns) are ldc apart.
  if (gelu != nullptr && (k == 0 || ldc % 8 != 0)) return false;
  if (gelu != nullptr && gelu->input.dtype() != c.dtype()) {
    Check(cudaErrorInvalidValue, "Matmul (a GELU epilogue's input not in its output's type)");
    return true;
  }
  if (k == 0) {  // C = beta C (+ bias): no product to take
    if (beta == 0) {
      for (int row = 0; row < m; ++row) Zero(c + static_cast<size_t>(row) * ldc, n);
    } else if (beta != 1) {
      for (int row = 0; row < m; ++row) Scale(c + static_cast<size_t>(row) * ldc, beta, n);
    }
    if (!bias.null()) AddBias(c, bias, m, n);  // ldc == n wherever a bias is fused
    return true;
  }
  if (a.dtype() != b.dtype()) {
    Check(cudaErrorInvalidValue, "Matmul (its two inputs differ in storage type)");
    return true;
  }
  // An epilogue's bias and GELU buffer take pointers aligned to 16 bytes (llm.c requires as much
  // of every cuBLASLt pointer). A bias packed at another offset (a small model's) is added after
  // the GEMM, and a GELU whose buffers are so placed runs apart.
  const bool bias_fits = bias.null() || Alignment(bias.data()) >= 16;
  if (gelu != nullptr && (!bias_fits || Alignment(gelu->input.data()) < 16)) return false;
  const ConstValues fused_bias = bias_fits ? bias : ConstValues();
  // Row-major C (M, N) is column-major C^T (N, M) = op(B)^T op(A)^T, so cuBLASLt's first operand
  // is b and its second is a; a row-major (R, S) matrix is a column-major (S, R) one, same ld.
  const cublasOperation_t op_first = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  // Float32 sums at every precision. Float32 inputs are rounded to TF32 or bf16 on the tensor
  // cores below highest (matmul_precision.h); bf16 inputs are bf16 already.
  const MatmulPrecision precision =
      exact || a.dtype() == DataType::kBF16 ? MatmulPrecision::kHighest : matmul_precision_;
  const cublasComputeType_t compute =
      precision == MatmulPrecision::kHigh     ? CUBLAS_COMPUTE_32F_FAST_TF32
      : precision == MatmulPrecision::kMedium ? CUBLAS_COMPUTE_32F_FAST_16BF
                                              : CUBLAS_COMPUTE_32F;
  CheckBlas(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), "MatmulDescCreate");
  CheckBlas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                           sizeof(op_first)),
            "TRANSA");
  CheckBlas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                           sizeof(op_second)),
            "TRANSB");
  cublasLtEpilogue_t epilogue =
      fused_bias.null() ? CUBLASLT_EPILOGUE_DEFAULT : CUBLASLT_EPILOGUE_BIAS;
  if (gelu != nullptr) {
    epilogue = gelu->pass == GeluEpilogue::Pass::kBackward ? CUBLASLT_EPILOGUE_DGELU
               : fused_bias.null()                         ? CUBLASLT_EPILOGUE_GELU_AUX
                                                           : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const int64_t input_ld = ldc;
    const void* input = gelu->input.data();
    CheckBlas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                             &input, sizeof(input)),
              "EPILOGUE_AUX_POINTER");
    CheckBlas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &input_ld,
                                             sizeof(input_ld)),
              "EPILOGUE_AUX_LD");
  }
  CheckBlas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            "EPILOGUE");
  if (!fused_bias.null()) {
    // The bias (N) is added to every row of row-major C: to each column of cuBLASLt's (N, M).
    const void* bias_data = fused_bias.data();
    const cudaDataType_t bias_type = CudaType(fused_bias.dtype());
    CheckBlas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_data,
                                             sizeof(bias_data)),
              "BIAS_POINTER");
    CheckBlas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                             sizeof(bias_type)),
              "BIAS_DATA_TYPE");
  }
  const cudaDataType_t input_type = CudaType(a.dtype());
  CheckBlas(
      cublasLtMatrixLayoutCreate(&first, input_type, transpose_b ? k : n, transpose_b ? n : k, ldb),
      "MatrixLayoutCreate");
  CheckBlas(cublasLtMatrixLayoutCreate(&second, input_type, transpose_a ? m : k,
                                       transpose_a ? k : m, lda),
            "MatrixLayoutCreate");
  CheckBlas(cublasLtMatrixLayoutCreate(&out, CudaType(c.dtype()), n, m, ldc), "MatrixLayoutCreate");
  CheckBlas(cublasLtMatmulPreferenceCreate(&preference), "MatmulPreferenceCreate");
  const size_t workspace_bytes = kWorkspaceBytes;
  CheckBlas(
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)),
      "MAX_WORKSPACE_BYTES");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b.data()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a.data()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c.data()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c.data()}};
  for (const auto& [attribute, pointer] : alignments) {
    const uint32_t alignment = Alignment(pointer);
    CheckBlas(
        cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment)),
        "MIN_ALIGNMENT");
  }
  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  const cublasStatus_t searched = cublasLtMatmulAlgoGetHeuristic(lt_, desc, first, second, out, out,
                                                                 preference, 1, &heuristic, &found);
  if (searched != CUBLAS_STATUS_SUCCESS) found = 0;
  // A GELU epilogue cuBLASLt refuses (NOT_SUPPORTED, INVALID_VALUE from a build that lacks it for
  // these types, or no algorithm found) is the caller's to run apart, where a real fault shows in
  // the plain GEMM; without an epilogue, any failure is an error.
  if (gelu == nullptr) CheckBlas(searched, "MatmulAlgoGetHeuristic");
  const bool ran = found > 0 || gelu == nullptr;
  if (found == 0 && gelu == nullptr) {
    CheckBlas(CUBLAS_STATUS_NOT_SUPPORTED, "MatmulAlgoGetHeuristic (no algorithm for the GEMM)");
  } else if (found > 0 && first_error_.ok()) {
    CheckBlas(cublasLtMatmul(lt_, desc, &alpha, b.data(), first, a.data(), second, &beta, c.data(),
                             out, c.data(), out, &heuristic.algo, own_.workspace.data(),
                             kWorkspaceBytes, stream_),
              "cublasLtMatmul");
  }
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(out);
  cublasLtMatrixLayoutDestroy(second);
  cublasLtMatrixLayoutDestroy(first);
  cublasLtMatmulDescDestroy(desc);
  if (fused_bias.null() && !bias.null()) AddBias(c, bias, m, n);  // ldc == n, as above
  return ran;
}

void CudaBackend::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                       const float* a, int lda, const float* b, int ldb, float beta, float* c,
                       int ldc) {
  Matmul(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nullptr);
}

void CudaBackend::LinearForward(Values out, ConstValues inp, ConstValues weight, ConstValues bias,
                                int n, int in_features, int out_features) {
  Matmul(false, true, n, out_features, in_features, 1.0f, inp, in_features, weight, in_features,
         0.0f, out, out_features, bias);
}

void CudaBackend::LinearGeluForward(Values out, Values pre, ConstValues inp, ConstValues weight,
                                    ConstValues bias, int n, int in_features, int out_features) {
  const GeluEpilogue gelu{GeluEpilogue::Pass::kForward, pre};
  if (Matmul(false, true, n, out_features, in_features, 1.0f, inp, in_features, weight, in_features,
             0.0f, out, out_features, bias, false, &gelu)) {
    return;
  }
  // No epilogue for this shape: the GELU takes pre as stored.
  LinearForward(pre, inp, weight, bias, n, in_features, out_features);
  GeluForward(out, pre, static_cast<size_t>(n) * out_features);
}

void CudaBackend::AddBias(Values out, ConstValues bias, int n, int c) {
  // out (N, C) += ones (N, 1) @ bias (1, C): each product is 1 * bias, exact, as the CPU's add.
  Matmul(false, false, n, c, 1, 1.0f, Ones(n, bias.dtype()), 1, bias, c, 1.0f, out, c, nullptr,
         true);
}

void CudaBackend::LinearBackward(Values dinp, float* dweight, float* dbias, ConstValues dout,
                                 ConstValues inp, ConstValues weight, int n, int in_features,
                                 int out_features) {
  if (!dinp.null()) {
    Matmul(false, false, n, in_features, out_features, 1.0f, dout, out_features, weight,
           in_features, 0.0f, dinp, in_features, nullptr);
  }
  Matmul(true, false, out_features, in_features, n, 1.0f, dout, out_features, inp, in_features,
         1.0f, dweight, in_features, nullptr);
  if (dbias != nullptr) {
    // dbias (1, OC) += ones (1, N) @ dout (N, OC).
    Matmul(false, false, 1, out_features, n, 1.0f, Ones(n, dout.dtype()), n, dout, out_features,
           1.0f, dbias, out_features, nullptr, true);
  }
}

void CudaBackend::LinearBackwardThroughGelu(Values dpre, float* dweight, float* dbias,
                                            ConstValues dout, ConstValues inp, ConstValues pre,
                                            ConstValues weight, int n, int in_features,
                                            int out_features) {
  // dpre (N, IC) = dout @ weight, then through the GELU.
  auto input_grad = [&](const GeluEpilogue* gelu) {
    return Matmul(false, false, n, in_features, out_features, 1.0f, dout, out_features, weight,
                  in_features, 0.0f, dpre, in_features, nullptr, false, gelu);
  };
  const GeluEpilogue gelu{GeluEpilogue::Pass::kBackward, pre};
  if (!input_grad(&gelu)) {
    // No epilogue for this shape: dpre is rounded to its type before the GELU's gradient.
    input_grad(nullptr);
    GeluBackward(dpre, pre, dpre, static_cast<size_t>(n) * in_features);  // in place
  }
  LinearBackward(nullptr, dweight, dbias, dout, inp, weight, n, in_features, out_features);
}

void CudaBackend::LayerNormForward(Values out, float* mean, float* rstd, ConstValues inp,
                                   ConstValues weight, ConstValues bias, int n, int c, float eps) {
  LaunchTyped("LayerNormForward", {out, inp, weight, bias}, [&]<typename T>(T) {
    cuda::LayerNormForward<T>(out.as<T>(), mean, rstd, nullptr, nullptr, inp.as<T>(),
                              weight.as<T>(), bias.as<T>(), n, c, eps, stream_);
  });
}

void CudaBackend::LayerNormBackward(Values dinp, float* dweight, float* dbias, ConstValues dout,
                                    ConstValues inp, ConstValues weight, const float* mean,
                                    const float* rstd, int n, int c) {
  LaunchTyped("LayerNormBackward", {dinp, dout, inp, weight}, [&]<typename T>(T) {
    cuda::LayerNormBackward<T>(dinp.as<T>(), dweight, dbias, ColumnSliceSums(n, c), dout.as<T>(),
                               inp.as<T>(), weight.as<T>(), mean, rstd, n, c, stream_);
  });
}

void CudaBackend::AddLayerNormForward(Values sum, Values out, float* mean, float* rstd,
                                      ConstValues residual, ConstValues inp, ConstValues weight,
                                      ConstValues bias, int n, int c, float eps) {
  LaunchTyped("LayerNormForward", {sum, out, residual, inp, weight, bias}, [&]<typename T>(T) {
    cuda::LayerNormForward<T>(out.as<T>(), mean, rstd, sum.as<T>(), residual.as<T>(), inp.as<T>(),
                              weight.as<T>(), bias.as<T>(), n, c, eps, stream_);
  });
}

void CudaBackend::AddRmsNormForward(Values sum, Values out, float* rstd, ConstValues residual,
                                    ConstValues inp, ConstValues weight, int n, int c, float eps) {
  LaunchTyped("RmsNormForward", {sum, out, residual, inp, weight}, [&]<typename T>(T) {
    cuda::RmsNormForward<T>(out.as<T>(), rstd, sum.as<T>(), residual.as<T>(), inp.as<T>(),
                            weight.as<T>(), n, c, eps, stream_);
  });
}

void CudaBackend::RmsNormForward(Values out, float* rstd, ConstValues inp, ConstValues weight,
                                 int n, int c, float eps) {
  LaunchTyped("RmsNormForward", {out, inp, weight}, [&]<typename T>(T) {
    cuda::RmsNormForward<T>(out.as<T>(), rstd, nullptr, nullptr, inp.as<T>(), weight.as<T>(), n, c,
                            eps, stream_);
  });
}

void CudaBackend::RmsNormBackward(Values dinp, float* dweight, ConstValues dout, ConstValues inp,
                                  ConstValues weight, const float* rstd, int n, int c) {
  LaunchTyped("RmsNormBackward", {dinp, dout, inp, weight}, [&]<typename T>(T) {
    cuda::RmsNormBackward<T>(dinp.as<T>(), dweight, ColumnSliceSums(n, c), dout.as<T>(),
                             inp.as<T>(), weight.as<T>(), rstd, n, c, stream_);
  });
}

void CudaBackend::GeluForward(Values out, ConstValues inp, size_t n) {
  LaunchTyped("GeluForward", {out, inp},
              [&]<typename T>(T) { cuda::GeluForward<T>(out.as<T>(), inp.as<T>(), n, stream_); });
}

void CudaBackend::GeluBackward(Values dinp, ConstValues inp, ConstValues dout, size_t n) {
  LaunchTyped("GeluBackward", {dinp, inp, dout}, [&]<typename T>(T) {
    cuda::GeluBackward<T>(dinp.as<T>(), inp.as<T>(), dout.as<T>(), n, stream_);
  });
}

void CudaBackend::SwiGluForward(Values out, ConstValues gate_up, int n, int f) {
  LaunchTyped("SwiGluForward", {out, gate_up}, [&]<typename T>(T) {
    cuda::SwiGluForward<T>(out.as<T>(), gate_up.as<T>(), n, f, stream_);
  });
}

void CudaBackend::SwiGluBackward(Values dgate_up, ConstValues gate_up, ConstValues dout, int n,
                                 int f) {
  LaunchTyped("SwiGluBackward", {dgate_up, gate_up, dout}, [&]<typename T>(T) {
    cuda::SwiGluBackward<T>(dgate_up.as<T>(), gate_up.as<T>(), dout.as<T>(), n, f, stream_);
  });
}

void CudaBackend::RopeForward(Values qkv, const AttentionShape& shape, float theta, int pos_offset,
                              const int32_t* positions) {
  LaunchTyped("RopeForward", {qkv}, [&]<typename T>(T) {
    cuda::RopeForward<T>(qkv.as<T>(), shape, theta, pos_offset, positions, stream_);
  });
}

void CudaBackend::RopeBackward(Values dqkv, const AttentionShape& shape, float theta,
                               int pos_offset, const int32_t* positions) {
  LaunchTyped("RopeBackward", {dqkv}, [&]<typename T>(T) {
    cuda::RopeBackward<T>(dqkv.as<T>(), shape, theta, pos_offset, positions, stream_);
  });
}

// The attention messages below state the kernels' limit.
static_assert(cuda::kAttentionMaxHeadDim == 512);

void CudaBackend::AttentionForward(Values out, float* lse, ConstValues qkv,
                                   const AttentionShape& shape, const int32_t* positions) {
  LaunchTyped("AttentionForward", {out, qkv}, [&]<typename T>(T) {
    Check(cuda::AttentionForward<T>(out.as<T>(), lse, qkv.as<T>(), shape, positions, stream_),
          "AttentionForward (head_dim at most 512, heads a multiple of kv_heads)");
  });
}

void CudaBackend::AttentionBackward(Values dqkv, ConstValues dout, ConstValues qkv, ConstValues out,
                                    const float* lse, const AttentionShape& shape,
                                    const int32_t* positions) {
  const size_t rows = static_cast<size_t>(shape.batch) * shape.heads * shape.time;
  float* deltas = Scratch(own_.deltas, rows, DataType::kF32).as<float>();
  LaunchTyped("AttentionBackward", {dqkv, dout, qkv, out}, [&]<typename T>(T) {
    Check(cuda::AttentionBackward<T>(dqkv.as<T>(), dout.as<T>(), qkv.as<T>(), out.as<T>(), lse,
                                     deltas, shape, positions, stream_),
          "AttentionBackward (head_dim at most 512, heads a multiple of kv_heads)");
  });
}

void CudaBackend::EmbeddingForward(Values out, const int32_t* tokens, ConstValues token_embedding,
                                   ConstValues position_embedding, int b, int t, int c,
                                   int vocab_begin, int vocab_end, const int32_t* positions) {
  LaunchTyped("EmbeddingForward", {out, token_embedding, position_embedding}, [&]<typename T>(T) {
    cuda::EmbeddingForward<T>(out.as<T>(), tokens, token_embedding.as<T>(),
                              position_embedding.as<T>(), b, t, c, vocab_begin, vocab_end,
                              positions, stream_);
  });
}

void CudaBackend::EmbeddingBackward(float* dtoken_embedding, float* dposition_embedding,
                                    ConstValues dout, const int32_t* tokens, int b, int t, int c,
                                    int vocab_begin, int vocab_end, const int32_t* positions) {
  const size_t scratch_bytes = cuda::EmbeddingBackwardScratchBytes(static_cast<size_t>(b) * t);
  void* scratch = Scratch(own_.embedding_sort, (scratch_bytes + 3) / 4, DataType::kF32).data();
  LaunchTyped("EmbeddingBackward", {dout}, [&]<typename T>(T) {
    Check(cuda::EmbeddingBackward<T>(dtoken_embedding, dposition_embedding, dout.as<T>(), tokens, b,
                                     t, c, vocab_begin, vocab_end, positions, scratch, stream_),
          "EmbeddingBackward's sort of the ids");
  });
}

void CudaBackend::ClassifierForwardBackward(Values dx, float* dweight, ConstValues x,
                                            ConstValues weight, const int32_t* targets, int n,
                                            int c, int v, float grad_scale, double* loss_sum) {
  if (n == 0) return;
  const int chunk_rows = std::min(n, GpuClassifierChunkRows(v, DataTypeBytes(x.dtype())));
  // (chunk, V) in the inputs' type, as llm.c's and autocast's logits: the dx GEMM multiplies
  // them with the weight. Rows start 16 bytes apart whatever V (GPT-2's 50257 is odd), or
  // cuBLASLt takes its slow unaligned kernels for the three largest GEMMs (llm.c pads the
  // vocabulary to 50304 for the same reason); the padding columns are never read.
  const int ld = GpuLogitsStride(v);
  const Values logits = Scratch(own_.logits, static_cast<size_t>(chunk_rows) * ld, x.dtype());
  float* losses = Scratch(own_.losses, n, DataType::kF32).as<float>();  // (N)
  for (int r0 = 0; r0 < n; r0 += chunk_rows) {
    const int rows = std::min(chunk_rows, n - r0);
    const ConstValues x_chunk = x + static_cast<size_t>(r0) * c;
    Matmul(false, true, rows, v, c, 1.0f, x_chunk, c, weight, c, 0.0f, logits, ld, nullptr);
    LaunchTyped("ClassifierSoftmaxCrossEntropy", {logits}, [&]<typename T>(T) {
      cuda::ClassifierSoftmaxCrossEntropy<T>(logits.as<T>(), ld, losses + r0, targets + r0, rows, v,
                                             grad_scale, !dx.null(), stream_);
    });
    if (dx.null()) continue;
    Matmul(false, false, rows, c, v, 1.0f, logits, ld, weight, c, 0.0f,
           dx + static_cast<size_t>(r0) * c, c, nullptr);
    Matmul(true, false, v, c, rows, 1.0f, logits, ld, x_chunk, c, 1.0f, dweight, c, nullptr);
  }
  cuda::AddSum(loss_sum, losses, n, stream_);
  CheckLaunch("AddSum (classifier loss)");
}

void CudaBackend::ClassifierRowMax(float* max, ConstValues logits, int n, int v) {
  LaunchTyped("VocabRowMax", {logits},
              [&]<typename T>(T) { cuda::VocabRowMax<T>(max, logits.as<T>(), n, v, stream_); });
}

void CudaBackend::ClassifierExpSums(Values logits, float* sums, float* target_logits,
                                    const float* max, const int32_t* targets, int n, int v,
                                    int vocab_begin) {
  LaunchTyped("VocabExpSums", {logits}, [&]<typename T>(T) {
    cuda::VocabExpSums<T>(logits.as<T>(), sums, target_logits, max, targets, n, v, vocab_begin,
                          stream_);
  });
}

void CudaBackend::ClassifierLossSum(const float* max, const float* sums, const float* target_logits,
                                    const int32_t* targets, int n, double* loss_sum) {
  if (n == 0) return;
  float* losses = Scratch(own_.losses, n, DataType::kF32).as<float>();
  cuda::VocabLosses(losses, max, sums, target_logits, targets, n, stream_);
  CheckLaunch("VocabLosses");
  cuda::AddSum(loss_sum, losses, n, stream_);
  CheckLaunch("AddSum (vocabulary-parallel loss)");
}

void CudaBackend::ClassifierLogitsBackward(Values logits, const float* sums, const int32_t* targets,
                                           int n, int v, int vocab_begin, float grad_scale) {
  LaunchTyped("VocabLogitsBackward", {logits}, [&]<typename T>(T) {
    cuda::VocabLogitsBackward<T>(logits.as<T>(), sums, targets, n, v, vocab_begin, grad_scale,
                                 stream_);
  });
}

void CudaBackend::Add(Values out, ConstValues a, ConstValues b, size_t n) {
  LaunchTyped("Add", {out, a, b},
              [&]<typename T>(T) { cuda::Add<T>(out.as<T>(), a.as<T>(), b.as<T>(), n, stream_); });
}

void CudaBackend::SumSquares(const float* x, size_t n, double* sum) {
  float* block_sums =
      Scratch(own_.block_sums, cuda::SumSquaresBlocks(n), DataType::kF32).as<float>();
  cuda::SumSquares<float>(sum, block_sums, x, n, stream_);
  CheckLaunch("SumSquares");
}

void CudaBackend::Convert(Values out, ConstValues x, size_t n) {
  if (out.dtype() == x.dtype()) return Copy(out.data(), x.data(), n * DataTypeBytes(x.dtype()));
  if (const float* from = x.as<float>(); from != nullptr && out.as<cuda::Bf16>() != nullptr) {
    cuda::Convert(out.as<cuda::Bf16>(), from, n, stream_);
  } else if (x.as<cuda::Bf16>() != nullptr && out.as<float>() != nullptr) {
    cuda::Convert(out.as<float>(), x.as<cuda::Bf16>(), n, stream_);
  } else {
    return Check(cudaErrorInvalidValue, "Convert (between float32 and bf16 only)");
  }
  CheckLaunch("Convert");
}

void CudaBackend::Scale(Values x, float factor, size_t n) {
  LaunchTyped("Scale", {x}, [&]<typename T>(T) { cuda::Scale<T>(x.as<T>(), factor, n, stream_); });
}

void CudaBackend::Zero(Values x, size_t n) {
  if (n == 0) return;
  Check(cudaMemsetAsync(x.data(), 0, n * DataTypeBytes(x.dtype()), stream_), "Zero");
}

void CudaBackend::AdamW(float* param, Values param_copy, const float* grad, float* m, float* v,
                        size_t n, const AdamWRange* ranges, int range_count, const AdamWStep& s) {
  if (!param_copy.null() && param_copy.dtype() != DataType::kBF16) {
    return Check(cudaErrorInvalidValue, "AdamW (a parameter copy not in bf16)");
  }
  const cuda::AdamWCoefficients k = cpu::MakeAdamWCoefficients<float>(
      s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step, s.grad_scale);
  cuda::AdamW(param, param_copy.as<Bf16>(), grad, m, v, n, ranges, range_count, k, stream_);
  CheckLaunch("AdamW");
}

}  // namespace dtrain
