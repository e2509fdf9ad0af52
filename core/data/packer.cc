#include "core/data/packer.h"

#include <algorithm>

namespace dtrain {

bool Packer::Fill(const std::vector<int32_t>& document, int64_t* position) {
  const size_t window = static_cast<size_t>(seq_len_) + 1;
  const int64_t doc_size = static_cast<int64_t>(document.size());
  if (*position < doc_size && window_.size() < window) {
    const int64_t count =
        std::min<int64_t>(doc_size - *position, static_cast<int64_t>(window - window_.size()));
    window_.insert(window_.end(), document.begin() + *position,
                   document.begin() + *position + count);
    *position += count;
  }
  if (eos_id_ >= 0 && *position == doc_size && window_.size() < window) {
    window_.push_back(eos_id_);
    ++*position;
  }
  return window_.size() == window;
}

void Packer::Emit(int32_t* inputs, int32_t* targets) {
  std::copy(window_.begin(), window_.end() - 1, inputs);
  std::copy(window_.begin() + 1, window_.end(), targets);
  window_.erase(window_.begin(), window_.end() - 1);
}

}  // namespace dtrain
