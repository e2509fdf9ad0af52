// A tensor's values in a backend's memory together with the type they are stored in: float32,
// or bf16 (`run.precision: bf16`'s compute copies of parameters and activations). The backend's
// kernels take their parameters and activations as Values (ConstValues when they only read
// them); a float* or Bf16* converts implicitly, so a float32 caller passes its pointers as they
// are. Offsets count elements of the stored type.
#pragma once

#include <cstddef>
#include <type_traits>

#include "core/backend/cuda/bf16.h"
#include "core/util/data_type.h"

namespace dtrain {

using cuda::Bf16;

// The DataType of a stored element type, float or Bf16.
template <typename T>
constexpr DataType StoredAs() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Bf16>, "values are float or Bf16");
  return std::is_same_v<T, Bf16> ? DataType::kBF16 : DataType::kF32;
}

template <bool kConst>
class BasicValues {
  template <typename T>
  using Element = std::conditional_t<kConst, const T, T>;
  using Pointer = Element<void>*;

 public:
  BasicValues() = default;
  BasicValues(std::nullptr_t) {}  // NOLINT: a null tensor (an optional bias), as with pointers
  BasicValues(Element<float>* data) : data_(data) {}  // NOLINT: float32 values pass as pointers
  BasicValues(Element<Bf16>* data) : data_(data), dtype_(DataType::kBF16) {}  // NOLINT
  BasicValues(Pointer data, DataType dtype) : data_(data), dtype_(dtype) {}
  BasicValues(const BasicValues&) = default;
  BasicValues& operator=(const BasicValues&) = default;
  // Values read only.
  template <bool kOtherConst>
  requires(kConst && !kOtherConst) BasicValues(const BasicValues<kOtherConst>& values)  // NOLINT
      : data_(values.data()), dtype_(values.dtype()) {}

  Pointer data() const { return data_; }
  DataType dtype() const { return dtype_; }
  bool null() const { return data_ == nullptr; }
  // The values as T (float or Bf16): null when they are stored as another type, so a mix-up
  // fails loudly.
  template <typename T>
  Element<T>* as() const {
    return dtype_ == StoredAs<T>() ? static_cast<Element<T>*>(data_) : nullptr;
  }
  // The values from element `offset` on.
  BasicValues operator+(size_t offset) const {
    if (data_ == nullptr) return *this;
    using Byte = Element<char>;
    return {static_cast<Byte*>(data_) + offset * DataTypeBytes(dtype_), dtype_};
  }

 private:
  Pointer data_ = nullptr;
  DataType dtype_ = DataType::kF32;
};

using Values = BasicValues<false>;
using ConstValues = BasicValues<true>;

}  // namespace dtrain
