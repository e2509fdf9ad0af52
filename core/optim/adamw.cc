#include "core/optim/adamw.h"

#include <fnmatch.h>

#include <algorithm>

#include "core/model/hf_names.h"

namespace dtrain {
namespace {

bool MatchesAny(const std::string& name, const std::vector<std::string>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& pattern) {
    return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
  });
}

struct DecayPiece {
  size_t offset, numel;
  bool exempt;  // matches train.no_decay
};

// A tensor is exempt from weight decay when a no_decay glob matches its internal name or its
// Hugging Face name, the one users know. Where one internal tensor holds several Hugging Face
// tensors (Llama's fused q/k/v and gate/up rows), each of their row ranges is decided alone.
std::vector<DecayPiece> DecayPieces(const ModelConfig& config, const TensorEntry& entry,
                                    const std::vector<std::string>& no_decay) {
  const bool internal_match = MatchesAny(entry.name, no_decay);
  const absl::StatusOr<std::vector<HfTensor>> hf = HfTensorsFor(config, entry);
  // A tensor-parallel slice has no Hugging Face counterpart; its internal name decides.
  if (!hf.ok()) return {{entry.offset, entry.numel, internal_match}};
  const size_t cols = entry.shape.size() == 2 ? static_cast<size_t>(entry.shape[1]) : 1;
  std::vector<DecayPiece> pieces;
  for (const HfTensor& t : *hf) {
    pieces.push_back({entry.offset + static_cast<size_t>(t.row_begin) * cols,
                      static_cast<size_t>(t.num_rows) * cols,
                      internal_match || MatchesAny(t.name, no_decay)});
  }
  return pieces;
}

}  // namespace

AdamW::AdamW(const ParamTable& table, const TrainSection& train, Backend& backend, size_t begin,
             size_t end)
    : begin_(begin),
      end_(end),
      beta1_(static_cast<float>(train.beta1)),
      beta2_(static_cast<float>(train.beta2)),
      eps_(static_cast<float>(train.eps)),
      weight_decay_(static_cast<float>(train.weight_decay)),
      m_(backend.Allocate(end_ - begin_)),
      v_(backend.Allocate(end_ - begin_)) {
  for (const TensorEntry& entry : table.entries()) {
    for (const auto& [offset, numel, exempt] : DecayPieces(table.config(), entry, train.no_decay)) {
      const size_t lo = std::max(begin_, offset);
      const size_t hi = std::min(end_, offset + numel);
      if (lo < hi) ranges_.push_back({lo, hi, !exempt});
    }
  }
}

void AdamW::Step(Backend& backend, float* params, const float* grads, float lr) {
  ++step_;
  for (const Range& r : ranges_) {
    const size_t at = r.begin - begin_;
    backend.AdamW(params + at, grads + at, m() + at, v() + at, r.end - r.begin, lr, beta1_, beta2_,
                  eps_, r.decay ? weight_decay_ : 0.0f, step_);
  }
}

size_t AdamW::decayed_numel() const {
  size_t total = 0;
  for (const Range& r : ranges_) total += r.decay ? r.end - r.begin : 0;
  return total;
}

}  // namespace dtrain
