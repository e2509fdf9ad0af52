// The residual add and the clipping scale (a thread per 16-byte pack) and the global norm's sum
// of squares (a warp per block of values, then one block over the block sums); arithmetic in
// elementwise_math.h.
#include "core/backend/cuda/elementwise_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/pack.cuh"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

template <typename T>
__global__ void SumSquaresOfBlocksKernel(float* block_sums, const T* x, size_t n, size_t blocks) {
  const size_t block = static_cast<size_t>(WarpRow());
  if (block >= blocks) return;
  const float sum = SumSquaresOfBlock(DeviceWarp{}, x, n, block);
  if (threadIdx.x % kWarpSize == 0) block_sums[block] = sum;
}

// One block: *total += the sum of values (n) in double.
__global__ void __launch_bounds__(kSumThreads)
    AddSumKernel(double* total, const float* values, size_t n) {
  __shared__ double shared[kSumThreads / kWarpSize];
  const double sum = SumInDouble<kSumThreads>(DeviceBlock{}, shared, values, n);
  if (threadIdx.x == 0) *total += sum;
}

template <typename T>
__global__ void ScaleKernel(T* x, float factor, size_t n) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPackSize<T>;
  if (i >= n) return;
  Pack<T> pack = LoadPack(x, i, n, T{});
  for (int k = 0; k < kPackSize<T>; ++k) pack.values[k] = ScaleValue(pack.values[k], factor);
  StorePack(x, i, n, pack);
}

template <typename To, typename From>
__global__ void ConvertKernel(To* out, const From* x, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = FromFloat<To>(ToFloat(x[i]));
}

template <typename T>
__global__ void AddKernel(T* out, const T* a, const T* b, size_t n) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPackSize<T>;
  if (i >= n) return;
  const Pack<T> x = LoadPack(a, i, n, T{}), y = LoadPack(b, i, n, T{});
  Pack<T> sum;
  for (int k = 0; k < kPackSize<T>; ++k) sum.values[k] = AddValues(x.values[k], y.values[k]);
  StorePack(out, i, n, sum);
}

}  // namespace

template <typename T>
void Add(T* out, const T* a, const T* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  AddKernel<<<PackBlocks<T>(n), kElementwiseThreads, 0, stream>>>(out, a, b, n);
}

template <typename T>
void SumSquares(double* sum_squares, float* block_sums, const T* x, size_t n, cudaStream_t stream) {
  const size_t blocks = SumSquaresBlocks(n);
  if (blocks > 0) {
    SumSquaresOfBlocksKernel<<<RowBlocks(static_cast<int>(blocks)), kRowWarpsPerBlock * kWarpSize,
                               0, stream>>>(block_sums, x, n, blocks);
  }
  AddSum(sum_squares, block_sums, blocks, stream);
}

void AddSum(double* total, const float* values, size_t n, cudaStream_t stream) {
  AddSumKernel<<<1, kSumThreads, 0, stream>>>(total, values, n);
}

template <typename T>
void Scale(T* x, float factor, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ScaleKernel<<<PackBlocks<T>(n), kElementwiseThreads, 0, stream>>>(x, factor, n);
}

template <typename To, typename From>
void Convert(To* out, const From* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks =
      static_cast<unsigned>((n + kElementwiseThreads - 1) / kElementwiseThreads);
  ConvertKernel<<<blocks, kElementwiseThreads, 0, stream>>>(out, x, n);
}

template void Convert<Bf16, float>(Bf16*, const float*, size_t, cudaStream_t);
template void Convert<float, Bf16>(float*, const Bf16*, size_t, cudaStream_t);

#define DTRAIN_INSTANTIATE(T)                                                   \
  template void Add<T>(T*, const T*, const T*, size_t, cudaStream_t);           \
  template void SumSquares<T>(double*, float*, const T*, size_t, cudaStream_t); \
  template void Scale<T>(T*, float, size_t, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
