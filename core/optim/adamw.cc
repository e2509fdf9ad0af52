#include "core/optim/adamw.h"

#include <fnmatch.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/hf_names.h"

namespace dtrain {
namespace {

bool Matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

// Whether `pattern` matches a Hugging Face tensor's name: GPT-2's also with the "transformer."
// prefix that GPT2LMHeadModel's names (and the safetensors save_pretrained writes) carry.
bool MatchesHfName(const ModelConfig& config, const std::string& pattern,
                   const std::string& hf_name) {
  return Matches(pattern, hf_name) ||
         (config.family == ModelFamily::kGpt2 && Matches(pattern, "transformer." + hf_name));
}

bool MatchesAny(const std::vector<std::string>& patterns,
                const std::function<bool(const std::string&)>& matches) {
  return std::any_of(patterns.begin(), patterns.end(), matches);
}

struct DecayPiece {
  size_t offset, numel;
  bool exempt;  // matches train.no_decay
};

// A tensor is exempt from weight decay when a no_decay glob matches its internal name or its
// Hugging Face name, the one users know. Where one internal tensor holds several Hugging Face
// tensors (Llama's fused q/k/v and gate/up rows), each of their row ranges is decided alone. A
// tensor-parallel shard is decided as the whole model's tensor is: each of its rows by the
// Hugging Face tensor its global row belongs to.
std::vector<DecayPiece> DecayPieces(const ModelConfig& config, const TensorEntry& entry,
                                    const std::vector<std::string>& no_decay) {
  const bool internal_match = MatchesAny(
      no_decay, [&](const std::string& pattern) { return Matches(pattern, entry.name); });
  TensorEntry whole = entry;
  whole.shape = entry.global_shape;
  const absl::StatusOr<std::vector<HfTensor>> hf = HfTensorsFor(config, whole);
  if (!hf.ok()) return {{entry.offset, entry.numel, internal_match}};
  const size_t cols = entry.shape.size() == 2 ? static_cast<size_t>(entry.shape[1]) : 1;
  std::vector<DecayPiece> pieces;
  int64_t local_row = 0;  // of the range's first row
  for (const RowRange& range : entry.rows) {
    for (const HfTensor& t : *hf) {
      const int64_t lo = std::max(range.global_begin, t.row_begin);
      const int64_t hi = std::min(range.global_begin + range.count, t.row_begin + t.num_rows);
      if (lo >= hi) continue;
      pieces.push_back(
          {entry.offset + static_cast<size_t>(local_row + lo - range.global_begin) * cols,
           static_cast<size_t>(hi - lo) * cols,
           internal_match || MatchesAny(no_decay, [&](const std::string& pattern) {
             return MatchesHfName(config, pattern, t.name);
           })});
    }
    local_row += range.count;
  }
  return pieces;
}

}  // namespace

absl::Status CheckNoDecay(const ModelConfig& config, const std::vector<std::string>& no_decay) {
  const ParamTable whole(config, ModelSlice{});
  const std::vector<std::string> defaults = TrainSection{}.no_decay;
  for (const std::string& pattern : no_decay) {
    // The defaults hold for either family: a Llama has no biases.
    if (std::find(defaults.begin(), defaults.end(), pattern) != defaults.end()) continue;
    const bool matched =
        std::any_of(whole.entries().begin(), whole.entries().end(), [&](const TensorEntry& entry) {
          if (Matches(pattern, entry.name)) return true;
          const absl::StatusOr<std::vector<HfTensor>> hf = HfTensorsFor(config, entry);
          return hf.ok() && std::any_of(hf->begin(), hf->end(), [&](const HfTensor& t) {
                   return MatchesHfName(config, pattern, t.name);
                 });
        });
    if (matched) continue;
    const bool gpt2 = config.family == ModelFamily::kGpt2;
    return absl::InvalidArgumentError(absl::StrCat(
        "train.no_decay: '", pattern, "' matches no tensor of this ", FamilyName(config.family),
        " model, so it exempts nothing from weight decay; globs match dtrain's names "
        "(blocks.0.norm1.weight) or Hugging Face's (",
        gpt2 ? "h.0.ln_1.weight or transformer.h.0.ln_1.weight"
             : "model.layers.0.input_layernorm.weight",
        ")",
        gpt2 && Matches(pattern, "lm_head.weight")
            ? "; GPT-2's head is its token embedding, wte.weight"
            : "",
        ": fix the glob or remove it"));
  }
  return absl::OkStatus();
}

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
      if (lo < hi) {
        ranges_.push_back({.begin = static_cast<int64_t>(lo - begin_),
                           .end = static_cast<int64_t>(hi - begin_),
                           .decay = exempt ? 0 : 1});
      }
    }
  }
  std::sort(ranges_.begin(), ranges_.end(),
            [](const AdamWRange& a, const AdamWRange& b) { return a.begin < b.begin; });
  // Neighbours alike in decay are one range.
  std::vector<AdamWRange> merged;
  for (const AdamWRange& range : ranges_) {
    if (!merged.empty() && merged.back().end == range.begin && merged.back().decay == range.decay) {
      merged.back().end = range.end;
    } else {
      merged.push_back(range);
    }
  }
  ranges_ = std::move(merged);
  static_assert(sizeof(AdamWRange) == 3 * sizeof(int64_t));
  ranges_on_backend_ = backend.Allocate(3 * ranges_.size(), DataType::kI64);
  backend.CopyFromHost(ranges_on_backend_.data(), ranges_.data(), ranges_on_backend_.bytes());
}

void AdamW::Step(Backend& backend, float* params, Values param_copy, const float* grads, float lr,
                 float grad_scale) {
  ++step_;
  if (ranges_.empty()) return;
  const AdamWStep settings{.lr = lr,
                           .beta1 = beta1_,
                           .beta2 = beta2_,
                           .eps = eps_,
                           .weight_decay = weight_decay_,
                           .step = step_,
                           .grad_scale = grad_scale};
  backend.AdamW(params, param_copy, grads, m(), v(), numel(),
                static_cast<const AdamWRange*>(ranges_on_backend_.data()),
                static_cast<int>(ranges_.size()), settings);
}

size_t AdamW::decayed_numel() const {
  size_t total = 0;
  for (const AdamWRange& r : ranges_) total += r.decay ? r.end - r.begin : 0;
  return total;
}

}  // namespace dtrain
