// run.matmul_precision: how the float32 GEMMs of the linear layers and the output head multiply,
// PyTorch's torch.set_float32_matmul_precision levels. Values stay float32 in memory and the
// products are summed in float32 at every level; what changes is the inputs the products see:
//   highest: float32 (cuBLASLt's CUBLAS_COMPUTE_32F; OpenBLAS sgemm),
//   high:    rounded to TF32, 10 mantissa bits (CUBLAS_COMPUTE_32F_FAST_TF32: tensor cores),
//   medium:  rounded to bfloat16, 7 mantissa bits (CUBLAS_COMPUTE_32F_FAST_16BF: tensor cores).
// The product of two such inputs is exact in float32, so the CPU backend computes what the
// tensor cores do by rounding the GEMM inputs (RoundForMatmul) before sgemm: the two differ in
// the order of the float32 sums only.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

enum class MatmulPrecision { kHighest, kHigh, kMedium };

absl::StatusOr<MatmulPrecision> ParseMatmulPrecision(absl::string_view name);
const char* MatmulPrecisionName(MatmulPrecision precision);  // "highest" | "high" | "medium"

// x as a GEMM at `precision` multiplies it: unchanged (highest), or rounded to nearest, ties to
// even, to TF32 (high; NaN and infinity unchanged) or bfloat16 (medium: the CUDA kernels' bf16
// rounding, core/backend/cuda/bf16.h).
float RoundForMatmul(float x, MatmulPrecision precision);

}  // namespace dtrain
