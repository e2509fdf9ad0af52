// The named-tensor table over one flat parameter buffer. Gradients and optimizer moments use
// the same layout, so a tensor is (offset, size) in all of them, a block is one contiguous
// range, and sharding a buffer is slicing it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/model_config.h"

namespace dtrain {

struct TensorEntry {
  std::string name;            // e.g. "blocks.3.attn.qkv.weight"
  std::vector<int64_t> shape;  // local shape (rows, cols) or (n)
  size_t offset = 0;           // in floats, from the start of the flat buffer
  size_t numel = 0;
  int block = -1;                    // -1: embeddings; 0..L-1: that block; L: final norm and head
  bool residual_projection = false;  // init scaled by 1/sqrt(2 n_layer) (GPT-2)
  bool is_norm_weight = false;       // initialised to 1
  bool is_bias = false;              // initialised to 0
};

// The tensors of one block, as offsets into the flat buffer (SIZE_MAX when absent).
struct BlockOffsets {
  size_t norm1_w, norm1_b, qkv_w, qkv_b, attn_out_w, attn_out_b;
  size_t norm2_w, norm2_b, mlp_up_w, mlp_up_b, mlp_down_w, mlp_down_b;
};

class ParamTable {
 public:
  ParamTable(const ModelConfig& config, const ModelSlice& slice);

  // The whole model's configuration the table was built from.
  const ModelConfig& config() const { return config_; }
  const std::vector<TensorEntry>& entries() const { return entries_; }
  size_t total_numel() const { return total_numel_; }
  const TensorEntry* Find(const std::string& name) const;
  // [begin, end) float range of region `block`'s tensors in the flat buffer: -1 the embeddings,
  // 0..n_layer-1 a block, n_layer the final norm and head ({0, 0} when this slice lacks it).
  std::pair<size_t, size_t> BlockRange(int block) const;

  const BlockOffsets& block(int i) const { return blocks_[i - first_block_]; }
  size_t token_embedding() const { return token_embedding_; }
  size_t position_embedding() const { return position_embedding_; }  // SIZE_MAX when absent
  size_t final_norm_w() const { return final_norm_w_; }
  size_t final_norm_b() const { return final_norm_b_; }  // SIZE_MAX when absent
  size_t head() const { return head_; }                  // the token embedding when tied

  int first_block() const { return first_block_; }
  // The highest region index: n_layer (the final norm and head). Regions run from -1.
  int last_region() const { return n_layer_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }

 private:
  size_t Add(std::string name, std::vector<int64_t> shape, int block);

  ModelConfig config_;
  std::vector<TensorEntry> entries_;
  std::vector<BlockOffsets> blocks_;
  size_t total_numel_ = 0;
  size_t token_embedding_ = 0, position_embedding_ = 0, final_norm_w_ = 0, final_norm_b_ = 0,
         head_ = 0;
  int first_block_ = 0;
  int n_layer_ = 0;
};

}  // namespace dtrain
