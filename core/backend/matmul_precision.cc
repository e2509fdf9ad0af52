#include "core/backend/matmul_precision.h"

#include <bit>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/backend/cuda/bf16.h"

namespace dtrain {
namespace {

// x with 10 mantissa bits, to nearest, ties to even, as bf16.h rounds to 7: adding 0xfff, plus
// the kept part's lowest bit, carries into the kept part exactly when the dropped 13 bits exceed
// half, or equal half and the kept part is odd.
float RoundToTf32(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // NaN, infinity
  return std::bit_cast<float>((bits + 0xfffu + ((bits >> 13) & 1u)) & ~0x1fffu);
}

}  // namespace

absl::StatusOr<MatmulPrecision> ParseMatmulPrecision(absl::string_view name) {
  if (name == "highest") return MatmulPrecision::kHighest;
  if (name == "high") return MatmulPrecision::kHigh;
  if (name == "medium") return MatmulPrecision::kMedium;
  return absl::InvalidArgumentError(
      absl::StrCat("run.matmul_precision '", name, "' is none of highest, high, medium"));
}

const char* MatmulPrecisionName(MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::kHighest:
      return "highest";
    case MatmulPrecision::kHigh:
      return "high";
    case MatmulPrecision::kMedium:
      return "medium";
  }
  return "?";
}

float RoundForMatmul(float x, MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::kHighest:
      return x;
    case MatmulPrecision::kHigh:
      return RoundToTf32(x);
    case MatmulPrecision::kMedium:
      return cuda::Bf16BitsToFloat(cuda::FloatToBf16Bits(x));
  }
  return x;
}

}  // namespace dtrain
