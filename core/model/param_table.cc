#include "core/model/param_table.h"

#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {
constexpr size_t kAbsent = std::numeric_limits<size_t>::max();
}  // namespace

ParamTable::ParamTable(const ModelConfig& config, const ModelSlice& slice) : config_(config) {
  const int64_t c = config.d_model;
  const int64_t d = config.head_dim;
  const int64_t heads = config.n_head / slice.tp_size;
  const int64_t kv_heads = config.n_kv_head / slice.tp_size;
  const int64_t ff = config.d_ff / slice.tp_size;
  const int64_t v = config.vocab_size;
  const bool gpt2 = config.family == ModelFamily::kGpt2;
  first_block_ = slice.first_block;
  n_layer_ = config.n_layer;
  const int last_block =
      slice.num_blocks < 0 ? config.n_layer : slice.first_block + slice.num_blocks;
  const bool has_embedding = first_block_ == 0;
  const bool has_head = last_block == config.n_layer;

  token_embedding_ = position_embedding_ = final_norm_w_ = final_norm_b_ = head_ = kAbsent;
  if (has_embedding) {
    token_embedding_ = Add("embed.tokens", {v, c}, -1);
    if (config.has_position_embedding()) {
      position_embedding_ = Add("embed.positions", {config.max_seq_len, c}, -1);
    }
  }
  for (int i = first_block_; i < last_block; ++i) {
    const std::string p = absl::StrCat("blocks.", i, ".");
    BlockOffsets b;
    b.norm1_w = Add(p + "norm1.weight", {c}, i);
    b.norm1_b = gpt2 ? Add(p + "norm1.bias", {c}, i) : kAbsent;
    b.qkv_w = Add(p + "attn.qkv.weight", {(heads + 2 * kv_heads) * d, c}, i);
    b.qkv_b = gpt2 ? Add(p + "attn.qkv.bias", {(heads + 2 * kv_heads) * d}, i) : kAbsent;
    b.attn_out_w = Add(p + "attn.out.weight", {c, heads * d}, i);
    b.attn_out_b = gpt2 ? Add(p + "attn.out.bias", {c}, i) : kAbsent;
    b.norm2_w = Add(p + "norm2.weight", {c}, i);
    b.norm2_b = gpt2 ? Add(p + "norm2.bias", {c}, i) : kAbsent;
    b.mlp_up_w = Add(p + "mlp.up.weight", {gpt2 ? ff : 2 * ff, c}, i);
    b.mlp_up_b = gpt2 ? Add(p + "mlp.up.bias", {ff}, i) : kAbsent;
    b.mlp_down_w = Add(p + "mlp.down.weight", {c, ff}, i);
    b.mlp_down_b = gpt2 ? Add(p + "mlp.down.bias", {c}, i) : kAbsent;
    blocks_.push_back(b);
  }
  if (has_head) {
    final_norm_w_ = Add("final_norm.weight", {c}, config.n_layer);
    if (gpt2) final_norm_b_ = Add("final_norm.bias", {c}, config.n_layer);
    // GPT-2 ties the output layer to the token embedding; a pipeline's last stage without the
    // embedding would hold its own copy (a later issue).
    head_ = config.tied_head() && has_embedding ? token_embedding_
                                                : Add("head.weight", {v, c}, config.n_layer);
  }
}

size_t ParamTable::Add(std::string name, std::vector<int64_t> shape, int block) {
  TensorEntry entry;
  entry.numel = 1;
  for (int64_t dim : shape) entry.numel *= static_cast<size_t>(dim);
  entry.offset = total_numel_;
  entry.block = block;
  entry.is_bias = absl::EndsWith(name, ".bias");
  entry.is_norm_weight = !entry.is_bias && absl::StrContains(name, "norm");
  entry.residual_projection =
      absl::EndsWith(name, "attn.out.weight") || absl::EndsWith(name, "mlp.down.weight");
  entry.name = std::move(name);
  entry.shape = std::move(shape);
  total_numel_ += entry.numel;
  entries_.push_back(std::move(entry));
  return entries_.back().offset;
}

const TensorEntry* ParamTable::Find(const std::string& name) const {
  for (const TensorEntry& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::pair<size_t, size_t> ParamTable::BlockRange(int block) const {
  size_t begin = kAbsent, end = 0;
  for (const TensorEntry& entry : entries_) {
    if (entry.block != block) continue;
    begin = std::min(begin, entry.offset);
    end = std::max(end, entry.offset + entry.numel);
  }
  return {begin == kAbsent ? 0 : begin, end};
}

}  // namespace dtrain
