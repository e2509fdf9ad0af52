// The named-tensor table over one flat parameter buffer. Gradients and optimizer moments use
// the same layout, so a tensor is (offset, size) in all of them, a block is one contiguous
// range, and sharding a buffer is slicing it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/model/model_config.h"

namespace dtrain {

// Global rows [global_begin, global_begin + count) of the whole model's tensor.
struct RowRange {
  int64_t global_begin = 0;
  int64_t count = 0;
};

struct TensorEntry {
  std::string name;            // e.g. "blocks.3.attn.qkv.weight"
  std::vector<int64_t> shape;  // local shape (rows, cols) or (n)
  // Where the local tensor lies in the whole model's (a tensor-parallel shard): its rows are
  // the global row ranges in order (one range covering everything when whole), its columns
  // the global columns [column_begin, column_begin + cols). A 1-D tensor is one column.
  std::vector<int64_t> global_shape;
  std::vector<RowRange> rows;
  int64_t column_begin = 0;
  size_t offset = 0;  // in floats, from the start of the flat buffer
  size_t numel = 0;
  int block = -1;                    // -1: embeddings; 0..L-1: that block; L: final norm and head
  bool residual_projection = false;  // init scaled by 1/sqrt(2 n_layer) (GPT-2)
  bool is_norm_weight = false;       // initialised to 1
  bool is_bias = false;              // initialised to 0
};

// Calls fn(local, global, count) for the runs of the tensor's elements [lo, hi) (indices in the
// local tensor) that are contiguous in the whole model's tensor: local element local + i is
// global element global + i, for i < count.
template <typename F>
void ForEachGlobalRun(const TensorEntry& entry, size_t lo, size_t hi, F&& fn) {
  const size_t cols = entry.shape.size() > 1 ? entry.shape[1] : 1;
  const size_t global_cols = entry.global_shape.size() > 1 ? entry.global_shape[1] : 1;
  size_t range_begin = 0;  // the range's first local element
  for (const RowRange& range : entry.rows) {
    const size_t range_end = range_begin + range.count * cols;
    const size_t stop = std::min(hi, range_end);
    for (size_t i = std::max(lo, range_begin); i < stop;) {
      const size_t row = (i - range_begin) / cols, col = (i - range_begin) % cols;
      // Whole rows are contiguous globally; a column block only within a row.
      const size_t run = cols == global_cols ? stop - i : std::min(stop - i, cols - col);
      fn(i, (range.global_begin + row) * global_cols + entry.column_begin + col, run);
      i += run;
    }
    range_begin = range_end;
  }
}

// A block's sizes on this rank: tensor parallelism gives each rank a share of the query heads,
// the kv heads and the MLP width. The model and its attention kernels use these, never the
// whole model's counts.
struct LocalDims {
  int d_model = 0;
  int heads = 0;        // query heads
  int kv_heads = 0;     // key/value heads held
  int kv_replicas = 1;  // ranks holding each kv head: tp / n_kv_head when tp > n_kv_head, else 1
  int head_dim = 0;
  int mlp_width = 0;     // F: the MLP's hidden width (per SwiGLU branch)
  int mlp_up_width = 0;  // F (GPT-2) or 2F (Llama: gate and up)
  // Vocabulary parallelism: at tp > 1 the vocabulary is padded to a multiple of tp x 64 and
  // rank r owns the slot [r * vocab_slot, (r + 1) * vocab_slot) of it; it holds (and computes
  // logits for) only the slot's real rows, [vocab_begin, vocab_end) = the slot clipped to
  // [0, V), which may be empty. Padded rows are never stored, so they never reach the loss, a
  // sample, a checkpoint or an export. At tp = 1: the whole vocabulary, vocab_slot = V.
  bool vocab_parallel = false;  // tp > 1
  int vocab_begin = 0;
  int vocab_end = 0;
  int vocab_slot = 0;
  int vocab_rows() const { return vocab_end - vocab_begin; }
  int attn_width() const { return heads * head_dim; }
  int qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

// The sizes a rank holding `slice` computes with (its tensor-parallel size must pass
// CheckTensorParallel).
LocalDims LocalDimsOf(const ModelConfig& config, const ModelSlice& slice);

// The tensors of one block, as offsets into the flat buffer (SIZE_MAX when absent).
struct BlockOffsets {
  size_t norm1_w, norm1_b, qkv_w, qkv_b, attn_out_w, attn_out_b;
  size_t norm2_w, norm2_b, mlp_up_w, mlp_up_b, mlp_down_w, mlp_down_b;
};

class ParamTable {
 public:
  // The slice's tensor-parallel size must pass CheckTensorParallel.
  ParamTable(const ModelConfig& config, const ModelSlice& slice);

  // The whole model's configuration the table was built from.
  const ModelConfig& config() const { return config_; }
  const LocalDims& dims() const { return dims_; }
  const ModelSlice& slice() const { return slice_; }

  const std::vector<TensorEntry>& entries() const { return entries_; }
  size_t total_numel() const { return total_numel_; }
  const TensorEntry* Find(const std::string& name) const;
  // [begin, end) float range of region `block`'s tensors in the flat buffer: -1 the embeddings,
  // 0..n_layer-1 a block, n_layer the final norm and head ({0, 0} when this slice lacks it).
  std::pair<size_t, size_t> BlockRange(int block) const;
  // Whether this slice holds region `block`, even with no elements: a Llama tensor-parallel
  // rank whose vocabulary slot is all padding holds the embeddings region as an empty tensor.
  bool HasRegion(int block) const;

  // The [begin, end) table ranges whose values this rank counts toward whole-model totals such
  // as the gradient norm and the checkpoint's chunks, so that the tensor-parallel and pipeline
  // ranks together count every element of the whole model exactly once: all of a shard, a
  // replicated tensor on tp rank 0 only, a replicated kv head on the first of the ranks holding
  // it, a tied head's copy never (the first stage's embedding counts). Ascending, adjacent
  // ranges merged.
  std::vector<std::pair<size_t, size_t>> CountedRanges() const;
  // Whether `entry` is a pipeline's last stage's copy of the tied embedding (GPT-2 without the
  // embedding in the slice): named "embed.tokens" like the embedding, in region n_layer. The
  // two copies start equal and stay equal when their gradients are summed over the two stages
  // every step.
  bool IsTiedHeadCopy(const TensorEntry& entry) const;

  const BlockOffsets& block(int i) const { return blocks_[block_index_[i]]; }
  size_t token_embedding() const { return token_embedding_; }
  size_t position_embedding() const { return position_embedding_; }  // SIZE_MAX when absent
  size_t final_norm_w() const { return final_norm_w_; }
  size_t final_norm_b() const { return final_norm_b_; }  // SIZE_MAX when absent
  // The output head's weight: the token embedding when tied and this slice holds it, the tied
  // copy (IsTiedHeadCopy) on a last stage without it.
  size_t head() const { return head_; }

  // The model chunks this slice holds (ChunksOf): the embedding belongs to the first when it
  // starts at block 0, the final norm and head to the last when it ends at n_layer.
  const std::vector<BlockSpan>& chunks() const { return chunks_; }
  // The chunk (an index into chunks()) holding region `region`, which the slice must hold.
  int ChunkOf(int region) const;
  bool HoldsWholeModel() const { return chunks_.size() == 1 && chunks_[0].count == n_layer_; }
  // The highest region index: n_layer (the final norm and head). Regions run from -1.
  int last_region() const { return n_layer_; }

 private:
  // A whole tensor when `rows` is empty; otherwise a shard of a tensor of global_shape.
  size_t Add(std::string name, std::vector<int64_t> shape, int block,
             std::vector<int64_t> global_shape = {}, std::vector<RowRange> rows = {},
             int64_t column_begin = 0);

  ModelConfig config_;
  LocalDims dims_;
  ModelSlice slice_;
  std::vector<TensorEntry> entries_;
  std::vector<BlockOffsets> blocks_;
  size_t total_numel_ = 0;
  size_t token_embedding_ = 0, position_embedding_ = 0, final_norm_w_ = 0, final_norm_b_ = 0,
         head_ = 0;
  std::vector<BlockSpan> chunks_;
  std::vector<int> block_index_;  // per block of the model: its index in blocks_, or -1
  int n_layer_ = 0;
};

}  // namespace dtrain
