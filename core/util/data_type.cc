#include "core/util/data_type.h"

#include "absl/strings/str_cat.h"

namespace dtrain {

size_t DataTypeBytes(DataType type) {
  switch (type) {
    case DataType::kBF16:
      return 2;
    case DataType::kF32:
      return 4;
    case DataType::kF64:
    case DataType::kI64:
    case DataType::kU64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kF32:
      return "f32";
    case DataType::kBF16:
      return "bf16";
    case DataType::kF64:
      return "f64";
    case DataType::kI64:
      return "i64";
    case DataType::kU64:
      return "u64";
  }
  return "unknown";
}

absl::StatusOr<DataType> ParseDataType(absl::string_view name) {
  for (const DataType type :
       {DataType::kF32, DataType::kBF16, DataType::kF64, DataType::kI64, DataType::kU64}) {
    if (name == DataTypeName(type)) return type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("data type \"", name, "\" is none of f32, bf16, f64, i64, u64"));
}

}  // namespace dtrain
