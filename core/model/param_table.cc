#include "core/model/param_table.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {
constexpr size_t kAbsent = std::numeric_limits<size_t>::max();
}  // namespace

LocalDims LocalDimsOf(const ModelConfig& config, const ModelSlice& slice) {
  const int tp = slice.tp_size;
  LocalDims dims;
  dims.d_model = config.d_model;
  dims.head_dim = config.head_dim;
  dims.heads = config.n_head / tp;
  // Fewer kv heads than ranks: each rank holds the one kv head its query heads read.
  const bool split_kv = config.n_kv_head % tp == 0;
  dims.kv_heads = split_kv ? config.n_kv_head / tp : 1;
  dims.kv_replicas = split_kv ? 1 : tp / config.n_kv_head;
  dims.mlp_width = config.d_ff / tp;
  dims.mlp_up_width = config.family == ModelFamily::kGpt2 ? dims.mlp_width : 2 * dims.mlp_width;
  // Multiples of 64 keep each slot's logits GEMM aligned (Megatron-LM pads the same way); tp = 1
  // pads nothing, so its tables, checkpoints and numerics are those of an unsplit model.
  const int v = config.vocab_size;
  const int granule = 64 * tp;
  dims.vocab_parallel = tp > 1;
  dims.vocab_slot = tp == 1 ? v : (v + granule - 1) / granule * granule / tp;
  dims.vocab_begin = std::min(v, slice.tp_rank * dims.vocab_slot);
  dims.vocab_end = std::min(v, (slice.tp_rank + 1) * dims.vocab_slot);
  return dims;
}

ParamTable::ParamTable(const ModelConfig& config, const ModelSlice& slice)
    : config_(config), dims_(LocalDimsOf(config, slice)), slice_(slice) {
  const int r = slice.tp_rank;
  const int64_t c = config.d_model;
  const int64_t d = config.head_dim;
  const bool gpt2 = config.family == ModelFamily::kGpt2;
  const bool split_kv = dims_.kv_replicas == 1;
  const int64_t heads = dims_.heads, kv_heads = dims_.kv_heads, ff = dims_.mlp_width;
  const int64_t v = config.vocab_size;
  // The vocabulary-parallel embedding and head: this rank's real vocabulary rows.
  const std::vector<RowRange> vocab_rows = {{dims_.vocab_begin, dims_.vocab_rows()}};
  const int64_t local_v = dims_.vocab_rows();
  const int64_t first_kv = split_kv ? r * kv_heads : r / dims_.kv_replicas;
  // The fused qkv rows are [Q (all heads); K; V]: a rank's rows are its heads' rows of each.
  const std::vector<RowRange> qkv_rows = {
      {r * heads * d, heads * d},
      {(config.n_head + first_kv) * d, kv_heads * d},
      {(config.n_head + config.n_kv_head + first_kv) * d, kv_heads * d}};
  const int64_t global_qkv = (config.n_head + 2 * config.n_kv_head) * d;
  // Llama's up is [gate; up], each d_ff rows: a rank holds its rows of both.
  std::vector<RowRange> up_rows = {{r * ff, ff}};
  if (!gpt2) up_rows.push_back({config.d_ff + r * ff, ff});
  const int64_t global_up = gpt2 ? config.d_ff : 2 * config.d_ff;
  n_layer_ = config.n_layer;
  chunks_ = ChunksOf(config, slice);
  const bool has_embedding = chunks_.front().first == 0;
  const bool has_head = chunks_.back().end() == config.n_layer;

  token_embedding_ = position_embedding_ = final_norm_w_ = final_norm_b_ = head_ = kAbsent;
  if (has_embedding) {
    token_embedding_ = Add("embed.tokens", {local_v, c}, -1, {v, c}, vocab_rows);
    if (config.has_position_embedding()) {
      position_embedding_ = Add("embed.positions", {config.max_seq_len, c}, -1);
    }
  }
  block_index_.assign(config.n_layer, -1);
  for (const BlockSpan& chunk : chunks_) {
    for (int i = chunk.first; i < chunk.end(); ++i) {
      const std::string p = absl::StrCat("blocks.", i, ".");
      BlockOffsets b;
      b.norm1_w = Add(p + "norm1.weight", {c}, i);
      b.norm1_b = gpt2 ? Add(p + "norm1.bias", {c}, i) : kAbsent;
      // Column-parallel: a rank holds rows of qkv and mlp.up (and their biases).
      b.qkv_w = Add(p + "attn.qkv.weight", {dims_.qkv_width(), c}, i, {global_qkv, c}, qkv_rows);
      b.qkv_b =
          gpt2 ? Add(p + "attn.qkv.bias", {dims_.qkv_width()}, i, {global_qkv}, qkv_rows) : kAbsent;
      // Row-parallel: a rank holds columns of attn.out and mlp.down; the bias is whole.
      b.attn_out_w = Add(p + "attn.out.weight", {c, heads * d}, i, {c, config.n_head * d}, {{0, c}},
                         r * heads * d);
      b.attn_out_b = gpt2 ? Add(p + "attn.out.bias", {c}, i) : kAbsent;
      b.norm2_w = Add(p + "norm2.weight", {c}, i);
      b.norm2_b = gpt2 ? Add(p + "norm2.bias", {c}, i) : kAbsent;
      b.mlp_up_w = Add(p + "mlp.up.weight", {dims_.mlp_up_width, c}, i, {global_up, c}, up_rows);
      b.mlp_up_b = gpt2 ? Add(p + "mlp.up.bias", {ff}, i, {global_up}, up_rows) : kAbsent;
      b.mlp_down_w = Add(p + "mlp.down.weight", {c, ff}, i, {c, config.d_ff}, {{0, c}}, r * ff);
      b.mlp_down_b = gpt2 ? Add(p + "mlp.down.bias", {c}, i) : kAbsent;
      block_index_[i] = static_cast<int>(blocks_.size());
      blocks_.push_back(b);
    }
  }
  if (has_head) {
    final_norm_w_ = Add("final_norm.weight", {c}, config.n_layer);
    if (gpt2) final_norm_b_ = Add("final_norm.bias", {c}, config.n_layer);
    // GPT-2 ties the output layer to the token embedding. A pipeline's last stage without the
    // embedding holds its own copy in the final region, under the embedding's name: it
    // initialises to the same values (init is a function of the name), loads from the same
    // checkpoint chunks, and CountedRanges leaves it to the first stage.
    if (config.tied_head() && has_embedding) {
      head_ = token_embedding_;
    } else {
      head_ = Add(config.tied_head() ? "embed.tokens" : "head.weight", {local_v, c}, config.n_layer,
                  {v, c}, vocab_rows);
    }
  }
}

size_t ParamTable::Add(std::string name, std::vector<int64_t> shape, int block,
                       std::vector<int64_t> global_shape, std::vector<RowRange> rows,
                       int64_t column_begin) {
  TensorEntry entry;
  entry.global_shape = global_shape.empty() ? shape : std::move(global_shape);
  entry.rows = rows.empty() ? std::vector<RowRange>{{0, shape[0]}} : std::move(rows);
  entry.column_begin = column_begin;
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

std::vector<std::pair<size_t, size_t>> ParamTable::CountedRanges() const {
  std::vector<std::pair<size_t, size_t>> ranges;
  auto count = [&ranges](size_t begin, size_t end) {
    if (begin == end) return;
    if (!ranges.empty() && ranges.back().second == begin) {
      ranges.back().second = end;
    } else {
      ranges.emplace_back(begin, end);
    }
  };
  const bool first_kv_holder = slice_.tp_rank % dims_.kv_replicas == 0;
  for (const TensorEntry& entry : entries_) {
    if (IsTiedHeadCopy(entry)) continue;      // the first stage's embedding counts
    if (entry.shape == entry.global_shape) {  // replicated on every tensor-parallel rank
      if (slice_.tp_rank == 0) count(entry.offset, entry.offset + entry.numel);
    } else if (absl::StrContains(entry.name, "attn.qkv.") && !first_kv_holder) {
      // Only the query rows (the first range) are this rank's alone.
      const size_t cols = entry.numel / entry.shape[0];
      count(entry.offset, entry.offset + entry.rows[0].count * cols);
    } else {
      count(entry.offset, entry.offset + entry.numel);
    }
  }
  return ranges;
}

bool ParamTable::IsTiedHeadCopy(const TensorEntry& entry) const {
  return entry.block == n_layer_ && entry.name == "embed.tokens";
}

const TensorEntry* ParamTable::Find(const std::string& name) const {
  for (const TensorEntry& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

int ParamTable::ChunkOf(int region) const {
  if (region < 0) return 0;
  if (region >= n_layer_) return static_cast<int>(chunks_.size()) - 1;
  for (size_t k = 0; k < chunks_.size(); ++k) {
    if (region < chunks_[k].end()) return static_cast<int>(k);
  }
  return static_cast<int>(chunks_.size()) - 1;
}

bool ParamTable::HasRegion(int block) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [block](const TensorEntry& entry) { return entry.block == block; });
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
