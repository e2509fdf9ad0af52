// DTRAIN_HD marks the arithmetic a CUDA kernel shares with its host test: __host__ __device__
// under nvcc, nothing under a plain C++ compiler, so the *_math.h headers of this folder compile
// (and their tests run) on machines without the CUDA toolkit.
#pragma once

#if defined(__CUDACC__)
#define DTRAIN_HD __host__ __device__
#else
#define DTRAIN_HD
#endif

namespace dtrain::cuda {

// Threads per warp: the row kernels give each row one warp.
inline constexpr int kWarpSize = 32;

}  // namespace dtrain::cuda
