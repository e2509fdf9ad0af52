#include "core/data/packer.h"

#include <algorithm>

namespace dtrain {

template <typename CopyFn>
bool Packer::FillFrom(int64_t doc_size, int64_t* position, const CopyFn& copy) {
  const size_t window = static_cast<size_t>(seq_len_) + 1;
  if (*position < doc_size && window_.size() < window) {
    const int64_t count =
        std::min<int64_t>(doc_size - *position, static_cast<int64_t>(window - window_.size()));
    const size_t filled = window_.size();
    window_.resize(filled + static_cast<size_t>(count));
    copy(*position, count, window_.data() + filled);
    *position += count;
  }
  if (eos_id_ >= 0 && *position == doc_size && window_.size() < window) {
    window_.push_back(eos_id_);
    ++*position;
  }
  return window_.size() == window;
}

bool Packer::Fill(const std::vector<int32_t>& document, int64_t* position) {
  return FillFrom(static_cast<int64_t>(document.size()), position,
                  [&](int64_t first, int64_t count, int32_t* out) {
                    std::copy_n(document.data() + first, count, out);
                  });
}

bool Packer::Fill(const TokenDocument& document, int64_t* position) {
  return FillFrom(document.size(), position, [&](int64_t first, int64_t count, int32_t* out) {
    document.CopyTo(first, count, out);
  });
}

void Packer::Emit(int32_t* inputs, int32_t* targets) {
  std::copy(window_.begin(), window_.end() - 1, inputs);
  std::copy(window_.begin() + 1, window_.end(), targets);
  window_.erase(window_.begin(), window_.end() - 1);
}

}  // namespace dtrain
