#include "core/backend/matmul_precision.h"

#include <bit>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// x with its lowest `dropped` mantissa bits rounded away, to nearest, ties to even: adding half
// less one, plus the kept part's lowest bit, carries into the kept part exactly when the dropped
// bits exceed half, or equal half and the kept part is odd.
float RoundMantissa(float x, int dropped) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // NaN, infinity
  const uint32_t half = 1u << (dropped - 1);
  bits += half - 1 + ((bits >> dropped) & 1u);
  return std::bit_cast<float>(bits & ~((1u << dropped) - 1));
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
      return RoundMantissa(x, 23 - 10);
    case MatmulPrecision::kMedium:
      return RoundMantissa(x, 23 - 7);
  }
  return x;
}

}  // namespace dtrain
