// The element type of a buffer, shared by the communicators (what a collective moves and how it
// reduces) and the checkpoint format (what a saved chunk holds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// kBF16 is raw bfloat16 bits.
enum class DataType { kF32, kBF16, kF64, kI64, kU64 };

size_t DataTypeBytes(DataType type);
const char* DataTypeName(DataType type);  // "f32", "bf16", "f64", "i64", "u64"
// The inverse of DataTypeName; another name is InvalidArgument naming it.
absl::StatusOr<DataType> ParseDataType(absl::string_view name);

// The DataType of a C++ element type; bf16 has none (pass its buffers untyped, with kBF16).
template <typename T>
constexpr DataType DataTypeOf() {
  if constexpr (std::is_same_v<T, float>) {
    return DataType::kF32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DataType::kF64;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return DataType::kI64;
  } else {
    static_assert(std::is_same_v<T, uint64_t>,
                  "typed buffers hold float, double, int64_t, uint64_t");
    return DataType::kU64;
  }
}

}  // namespace dtrain
