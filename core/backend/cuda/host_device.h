// DTRAIN_HD marks the arithmetic a CUDA kernel shares with its host test: __host__ __device__
// under nvcc, nothing under a plain C++ compiler, so the *_math.h headers of this folder compile
// (and their tests run) on machines without the CUDA toolkit.
#pragma once

#if defined(__CUDACC__)
#define DTRAIN_HD __host__ __device__
#else
#define DTRAIN_HD
#endif

// Before a loop over a register array (a tile's fragments): unrolled in device code, the array
// stays in registers rather than local memory.
#if defined(__CUDA_ARCH__)
#define DTRAIN_UNROLL _Pragma("unroll")
#else
#define DTRAIN_UNROLL
#endif

namespace dtrain::cuda {

// Threads per warp: the row kernels give each row one warp.
inline constexpr int kWarpSize = 32;

}  // namespace dtrain::cuda
