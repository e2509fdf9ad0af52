#include "core/optim/adamw.h"

#include <fnmatch.h>

#include <algorithm>

namespace dtrain {
namespace {

bool MatchesAny(const std::string& name, const std::vector<std::string>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& pattern) {
    return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
  });
}

}  // namespace

AdamW::AdamW(const ParamTable& table, const TrainSection& train, size_t begin, size_t end)
    : begin_(begin),
      end_(end),
      beta1_(static_cast<float>(train.beta1)),
      beta2_(static_cast<float>(train.beta2)),
      eps_(static_cast<float>(train.eps)),
      weight_decay_(static_cast<float>(train.weight_decay)),
      m_(end_ - begin_),
      v_(end_ - begin_) {
  for (const TensorEntry& entry : table.entries()) {
    const size_t lo = std::max(begin_, entry.offset);
    const size_t hi = std::min(end_, entry.offset + entry.numel);
    if (lo < hi) ranges_.push_back({lo, hi, !MatchesAny(entry.name, train.no_decay)});
  }
}

void AdamW::Step(Backend& backend, float* params, const float* grads, float lr) {
  ++step_;
  for (const Range& r : ranges_) {
    const size_t at = r.begin - begin_;
    backend.AdamW(params + at, grads + at, m_.data() + at, v_.data() + at, r.end - r.begin, lr,
                  beta1_, beta2_, eps_, r.decay ? weight_decay_ : 0.0f, step_);
  }
}

size_t AdamW::decayed_numel() const {
  size_t total = 0;
  for (const Range& r : ranges_) total += r.decay ? r.end - r.begin : 0;
  return total;
}

}  // namespace dtrain
