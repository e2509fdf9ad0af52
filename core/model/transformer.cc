#include "core/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace dtrain {
namespace {
constexpr size_t kAbsent = std::numeric_limits<size_t>::max();

// Rows of the residual stream one of `chunks` ranks holds for `tokens` token rows (the
// constructor's split; chunks = 1 without sequence parallelism).
int64_t OwnRows(int64_t tokens, int chunks) { return (tokens + chunks - 1) / chunks; }

// The blocks of the largest model chunk a rank holding `slice` runs (an activation slot's), and
// whether it holds the last (the final norm, the head and the loss), as the ParamTable lays
// them out.
struct StageExtent {
  int blocks = 0;
  bool has_head = false;
};
StageExtent ExtentOf(const ModelConfig& config, const ModelSlice& slice) {
  const std::vector<BlockSpan> chunks = ChunksOf(config, slice);
  StageExtent extent{.has_head = chunks.back().end() == config.n_layer};
  for (const BlockSpan& chunk : chunks) extent.blocks = std::max(extent.blocks, chunk.count);
  return extent;
}

// The vocabulary-parallel classifier's chunk rows for micro-batches of up to max_tokens (0 at
// tp = 1, whose fused kernel keeps its chunk in the backend's scratch, and without the head).
int VocabChunkCapacity(const LocalDims& dims, bool has_head, int max_tokens) {
  return dims.vocab_parallel && has_head
             ? std::min(max_tokens, ClassifierChunkRows(dims.vocab_slot))
             : 0;
}

// The activation arena's size: its activations (in the activation type) and its float32
// statistics and gradient scratch, in size_t to allocate them, in double to check a size before
// allocating without overflow (AllocateActivations lays them out). `chunks` is tp under sequence
// parallelism, else 1.
template <typename T>
struct ArenaSize {
  T values = 0;
  T stats = 0;
};
template <typename T>
ArenaSize<T> ArenaSizeOf(ModelFamily family, const LocalDims& dims, int max_batch, int max_time,
                         Recompute recompute, int chunks, StageExtent stage, int activation_slots) {
  const int64_t tokens = static_cast<int64_t>(max_batch) * max_time;
  const T n = static_cast<T>(tokens);
  const T r = static_cast<T>(OwnRows(tokens, chunks));           // rows this rank holds
  const T g = static_cast<T>(OwnRows(tokens, chunks) * chunks);  // gathered rows
  const T c = static_cast<T>(dims.d_model);
  const T hd = static_cast<T>(dims.attn_width());
  const T qkv = static_cast<T>(dims.qkv_width());
  const T f = static_cast<T>(dims.mlp_width);
  const T up = static_cast<T>(dims.mlp_up_width);
  const T lse = static_cast<T>(max_batch) * static_cast<T>(dims.heads) * max_time;
  // The gradient of the MLP's activation output: SwiGLU's; GPT-2 carries it through its GELU
  // within the down-projection's backward (LinearBackwardThroughGelu).
  const T d_act = family == ModelFamily::kLlama ? f : 0;
  // The attention core's output, and its log-sum-exp among the statistics.
  const T core = n * hd;
  // norm1, resid_mid, norm2, qkv, mlp_up, mlp_act; each norm's mean and rstd.
  const T per_block = 2 * g * c + r * c + n * (qkv + up + f);
  const T per_block_stats = 4 * r;
  const T slots = static_cast<T>(activation_slots);
  const T slot_blocks = slots * static_cast<T>(stage.blocks);
  const T saved_blocks = recompute == Recompute::kFull ? 1 : slot_blocks;
  const T saved_cores = recompute == Recompute::kNone ? slot_blocks : 1;
  const T head = stage.has_head ? 1 : 0;
  // One slot needs no d(last output) of its own: the backward scratch keeps it.
  const T d_last = stage.has_head && activation_slots > 1 ? slots * r * c : 0;
  const T qkv_weight_grad = dims.kv_replicas > 1 ? qkv * c : 0;
  const T vocab_rows =
      static_cast<T>(VocabChunkCapacity(dims, stage.has_head, static_cast<int>(tokens)));
  return {.values = slot_blocks * r * c + head * r * c  // block inputs and the last output
                    + saved_blocks * per_block + saved_cores * core  // saved activations
                    + head * g * c + d_last  // final norm, d(last output) per slot
                    + r * c + 2 * g * c + n * (qkv + hd + up + d_act)  // backward scratch
                    + (chunks > 1 ? r * c : 0)                         // own rows of d(norm)
                    + vocab_rows * dims.vocab_rows(),                  // vocabulary-parallel logits
          .stats = saved_blocks * per_block_stats + saved_cores * lse  // means, rstds, lse
                   + head * 2 * r                                      // the final norm's
                   + (chunks > 1 ? 4 * c : 0)                          // norm gradients
                   + qkv_weight_grad   // replicated kv heads' weight gradient
                   + vocab_rows * 3};  // vocabulary-parallel row statistics
}

// The number of ranks the residual stream is split over.
int RowChunks(const ModelSlice& slice, bool sequence_parallel) {
  return sequence_parallel && slice.tp_size > 1 ? slice.tp_size : 1;
}

}  // namespace

double Transformer::ActivationBytes(const ModelConfig& config, int max_batch, int max_time,
                                    Recompute recompute, const ModelSlice& slice,
                                    bool sequence_parallel, int activation_slots,
                                    DataType activation_type) {
  const ArenaSize<double> size = ArenaSizeOf<double>(
      config.family, LocalDimsOf(config, slice), max_batch, max_time, recompute,
      RowChunks(slice, sequence_parallel), ExtentOf(config, slice), activation_slots);
  return size.values * static_cast<double>(DataTypeBytes(activation_type)) +
         size.stats * sizeof(float);
}

Transformer::Transformer(const ModelConfig& config, const ParamTable& table,
                         BlockParameters& parameters, Backend& backend, int max_batch, int max_time,
                         Recompute recompute, TensorParallelOps* tensor_parallel,
                         bool sequence_parallel, int activation_slots)
    : config_(config),
      table_(table),
      dims_(table.dims()),
      tp_(tensor_parallel != nullptr ? *tensor_parallel : no_tensor_parallel_),
      parameters_(parameters),
      backend_(backend),
      recompute_(recompute),
      last_region_(table.last_region()),
      chunks_(table.chunks()),
      slot_blocks_(ExtentOf(config, table.slice()).blocks),
      has_embedding_(chunks_.front().first == 0),
      has_head_(chunks_.back().end() == config.n_layer),
      // With the head present, head() == token_embedding() only when both are one tensor.
      head_is_embedding_(has_head_ && table.head() == table.token_embedding()),
      sequence_parallel_(RowChunks(table.slice(), sequence_parallel) > 1) {
  AllocateActivations(max_batch, max_time, activation_slots);
}

template <typename Base>
Base Transformer::RegionView<Base>::operator()(size_t offset) const {
  return offset == kAbsent ? Base() : base + (offset - begin);
}

Transformer::ParamView Transformer::Params(int region, Pass pass) {
  return {parameters_.Acquire(region, pass), table_.BlockRange(region).first};
}

Transformer::GradView Transformer::Grads(int region) {
  return {parameters_.Gradients(region), table_.BlockRange(region).first};
}

AttentionShape Transformer::Shape(int b, int t) const {
  return AttentionShape{b, t, dims_.heads, dims_.kv_heads, dims_.head_dim};
}

Transformer::RowSplit Transformer::SplitRows(int n) const {
  if (!sequence_parallel_) return {.n = n, .own = n, .begin = 0, .padded = n};
  const int chunks = table_.slice().tp_size;
  const int own = static_cast<int>(OwnRows(n, chunks));
  return {.n = n, .own = own, .begin = table_.slice().tp_rank * own, .padded = own * chunks};
}

void Transformer::RowParallelResidual(Values resid_out, ConstValues resid_in, ConstValues inp,
                                      ConstValues weight, ConstValues bias, const RowSplit& rows,
                                      int in_features) {
  const ConstValues branch =
      ProjectBranch(resid_out, resid_in, inp, weight, bias, rows, in_features);
  if (!branch.null()) {
    backend_.Add(resid_out, resid_in, branch, static_cast<size_t>(rows.own) * dims_.d_model);
  }
}

ConstValues Transformer::ProjectBranch(Values resid_out, ConstValues resid_in, ConstValues inp,
                                       ConstValues weight, ConstValues bias, const RowSplit& rows,
                                       int in_features) {
  const int c = dims_.d_model;
  const size_t own_size = static_cast<size_t>(rows.own) * c;
  if (table_.slice().tp_size == 1) {  // nothing to sum: the GEMM adds the bias in its pass
    backend_.LinearForward(branch_out_, inp, weight, bias, rows.n, in_features, c);
    return branch_out_;
  }
  backend_.LinearForward(branch_out_, inp, weight, nullptr, rows.n, in_features, c);
  if (!sequence_parallel_) {
    tp_.ReduceForward(branch_out_, own_size);
    if (!bias.null()) backend_.AddBias(branch_out_, bias, rows.n, c);
    return branch_out_;
  }
  backend_.Zero(branch_out_ + static_cast<size_t>(rows.n) * c,
                static_cast<size_t>(rows.padded - rows.n) * c);
  // Reduce-scattered straight into the output: the residual add below reads it back in place.
  tp_.ScatterRows(branch_out_, resid_out, own_size);
  if (!bias.null()) backend_.AddBias(resid_out, bias, rows.own, c);
  backend_.Add(resid_out, resid_in, resid_out, own_size);
  return nullptr;
}

void Transformer::GatherNormOutput(Values norm_out, const RowSplit& rows) {
  if (!sequence_parallel_) return;
  const size_t own_size = static_cast<size_t>(rows.own) * dims_.d_model;
  tp_.GatherRows(norm_out + static_cast<size_t>(rows.begin) * dims_.d_model, norm_out, own_size);
}

ConstValues Transformer::BranchOutputGrad(ConstValues dresid, const RowSplit& rows) {
  if (!sequence_parallel_) return dresid;
  tp_.GatherRows(dresid, branch_out_, static_cast<size_t>(rows.own) * dims_.d_model);
  return branch_out_;
}

ConstValues Transformer::NormOutputGrad(const RowSplit& rows) {
  const int c = dims_.d_model;
  if (!sequence_parallel_) {
    tp_.ReduceBackward(d_norm_, static_cast<size_t>(rows.n) * c);
    return d_norm_;
  }
  backend_.Zero(d_norm_ + static_cast<size_t>(rows.n) * c,
                static_cast<size_t>(rows.padded - rows.n) * c);
  tp_.ScatterRows(d_norm_, d_own_rows_, static_cast<size_t>(rows.own) * c);
  return d_own_rows_;
}

float* Transformer::NormGrad(const GradView& grads, size_t offset, int slot) {
  if (!sequence_parallel_ || offset == kAbsent) return grads(offset);
  return norm_grads_ + static_cast<size_t>(slot) * dims_.d_model;
}

void Transformer::BeginNormGrads() {
  if (sequence_parallel_) backend_.Zero(norm_grads_, 4 * static_cast<size_t>(dims_.d_model));
}

void Transformer::FinishNormGrads(const GradView& grads, std::initializer_list<size_t> offsets) {
  if (!sequence_parallel_) return;
  const size_t c = dims_.d_model;
  size_t present = 0;
  for (const size_t offset : offsets) present += offset != kAbsent ? 1 : 0;
  tp_.SumRowGradients(norm_grads_, present * c);
  size_t slot = 0;
  for (const size_t offset : offsets) {
    if (offset == kAbsent) continue;
    backend_.Add(grads(offset), grads(offset), norm_grads_ + slot * c, c);
    ++slot;
  }
}

void Transformer::EmbeddingForward(const int32_t* inputs, const int32_t* positions, int b, int t,
                                   const RowSplit& rows, Values out) {
  const int c = config_.d_model;
  const ConstValues tokens = embeddings_(table_.token_embedding());
  // Vocabulary-parallel (tp > 1): each rank looks up only the tokens in its rows (zeros for the
  // others) and g sums the ranks' lookups; the replicated position embedding joins on tp rank 0
  // only. Exactly one rank contributes each of the two terms, so the sum adds only zeros to
  // them: the embedding is the single process's bit for bit (up to the sign of a zero).
  const ConstValues position_table =
      table_.slice().tp_rank == 0 ? embeddings_(table_.position_embedding()) : nullptr;
  if (!sequence_parallel_) {
    backend_.EmbeddingForward(out, inputs, tokens, position_table, b, t, c, dims_.vocab_begin,
                              dims_.vocab_end, positions);
    if (dims_.vocab_parallel) tp_.ReduceForward(out, static_cast<size_t>(b) * t * c);
    return;
  }
  // Under sequence parallelism g is a reduce-scatter into this rank's rows of the stream.
  backend_.EmbeddingForward(branch_out_, inputs, tokens, position_table, b, t, c, dims_.vocab_begin,
                            dims_.vocab_end, positions);
  backend_.Zero(branch_out_ + static_cast<size_t>(rows.n) * c,
                static_cast<size_t>(rows.padded - rows.n) * c);
  tp_.ScatterRows(branch_out_, out, static_cast<size_t>(rows.own) * c);
}

void Transformer::EmbeddingBackward(const int32_t* inputs, const int32_t* positions, int b, int t,
                                    const RowSplit& rows, ConstValues dresid) {
  // Every rank needs d(embedding output) for all rows (gathered under sequence parallelism), and
  // adds it to the token rows it holds; the position embedding's gradient is then the same on
  // every rank.
  const GradView grads = Grads(-1);
  backend_.EmbeddingBackward(grads(table_.token_embedding()), grads(table_.position_embedding()),
                             BranchOutputGrad(dresid, rows), inputs, b, t, config_.d_model,
                             dims_.vocab_begin, dims_.vocab_end, positions);
}

void Transformer::AllocateActivations(int max_batch, int max_time, int activation_slots) {
  const size_t n = static_cast<size_t>(max_batch) * max_time;
  max_tokens_ = static_cast<int>(n);
  const int chunks = RowChunks(table_.slice(), sequence_parallel_);
  const size_t r = OwnRows(max_tokens_, chunks);
  const size_t g = r * chunks;
  const size_t c = dims_.d_model;
  const size_t hd = dims_.attn_width();
  const size_t qkv = dims_.qkv_width();
  const size_t f = dims_.mlp_width;
  const size_t up = dims_.mlp_up_width;
  const size_t lse = static_cast<size_t>(max_batch) * dims_.heads * max_time;
  const size_t qkv_weight_grad = dims_.kv_replicas > 1 ? qkv * c : 0;
  const ArenaSize<size_t> size =
      ArenaSizeOf<size_t>(config_.family, dims_, max_batch, max_time, recompute_, chunks,
                          ExtentOf(config_, table_.slice()), activation_slots);
  acts_ = backend_.Allocate(size.values, parameters_.compute_type());
  stats_ = backend_.Allocate(size.stats, DataType::kF32);

  // Two cursors: activations in their type, statistics (and gradient scratch) in float32.
  Values cursor = acts_.values();
  auto take = [&cursor](size_t count) {
    const Values p = cursor;
    cursor = cursor + count;
    return p;
  };
  float* stats_cursor = stats_.floats();
  auto take_stats = [&stats_cursor](size_t count) {
    float* p = stats_cursor;
    stats_cursor += count;
    return p;
  };
  auto take_block = [&](BlockActivations& a) {
    a.norm1 = take(g * c);
    a.norm1_mean = take_stats(r);
    a.norm1_rstd = take_stats(r);
    a.qkv = take(n * qkv);
    a.resid_mid = take(r * c);
    a.norm2 = take(g * c);
    a.norm2_mean = take_stats(r);
    a.norm2_rstd = take_stats(r);
    a.mlp_up = take(n * up);
    a.mlp_act = take(n * f);
  };
  auto take_core = [&](BlockActivations& a) {
    a.attn = take(n * hd);
    a.lse = take_stats(lse);
  };
  slots_.assign(activation_slots, Slot{});
  for (Slot& slot : slots_) {
    for (int i = 0; i < slot_blocks_; ++i) slot.inputs.push_back(take(r * c));
    if (recompute_ == Recompute::kFull) continue;
    slot.blocks.assign(slot_blocks_, BlockActivations{});
    for (BlockActivations& a : slot.blocks) {
      take_block(a);
      if (recompute_ == Recompute::kNone) take_core(a);
    }
  }
  // Under kSelective every block of every slot shares one core; under kFull the one block has it.
  if (recompute_ == Recompute::kFull) take_block(full_block_);
  if (recompute_ != Recompute::kNone) {
    take_core(full_block_);
    for (Slot& slot : slots_) {
      for (BlockActivations& a : slot.blocks) {
        a.attn = full_block_.attn;
        a.lse = full_block_.lse;
      }
    }
  }
  if (has_head_) {
    last_output_ = take(r * c);
    final_norm_ = take(g * c);
    final_mean_ = take_stats(r);
    final_rstd_ = take_stats(r);
    if (activation_slots > 1) {
      for (Slot& slot : slots_) slot.d_last = take(r * c);
    }
  }
  d_resid_ = take(r * c);
  // One slot: nothing else can be in flight between its forward and backward, so the backward
  // scratch keeps d(last output).
  if (has_head_ && activation_slots == 1) slots_[0].d_last = d_resid_;
  d_norm_ = take(g * c);
  d_qkv_ = take(n * qkv);
  d_attn_ = take(n * hd);
  d_mlp_up_ = take(n * up);
  if (config_.family == ModelFamily::kLlama) d_mlp_act_ = take(n * f);
  branch_out_ = take(g * c);
  if (chunks > 1) {
    d_own_rows_ = take(r * c);
    norm_grads_ = take_stats(4 * c);
  }
  d_qkv_weight_ = qkv_weight_grad > 0 ? take_stats(qkv_weight_grad) : nullptr;
  vocab_chunk_rows_ = VocabChunkCapacity(dims_, has_head_, max_tokens_);
  vocab_logits_ = take(static_cast<size_t>(vocab_chunk_rows_) * dims_.vocab_rows());
  vocab_stats_ = take_stats(3 * static_cast<size_t>(vocab_chunk_rows_));

  static_assert(sizeof(int32_t) == sizeof(float));
  // Each slot's token ids and document positions, then the targets.
  token_ids_ = backend_.Allocate((2 * slots_.size() + 1) * n);
  int32_t* ids = static_cast<int32_t*>(token_ids_.data());
  for (Slot& slot : slots_) {
    slot.staged_tokens = ids;
    slot.staged_positions = ids + n;
    ids += 2 * n;
  }
  staged_targets_ = ids;
  loss_sums_ = backend_.Allocate(2, DataType::kF64);
}

Transformer::BlockActivations& Transformer::ActivationsFor(int slot, int index) {
  return recompute_ == Recompute::kFull ? full_block_ : slots_[slot].blocks[index];
}

void Transformer::BlockForward(int layer, const ParamView& params, BlockActivations& a,
                               ConstValues in, Values out, int b, int t, const int32_t* positions) {
  const BlockOffsets& w = table_.block(layer);
  const int n = b * t;
  const int c = dims_.d_model;
  const int hd = dims_.attn_width();
  const AttentionShape shape = Shape(b, t);
  const int f = dims_.mlp_width;
  const bool llama = config_.family == ModelFamily::kLlama;
  // The norms run on this rank's rows of the residual stream, into their place in the gathered
  // output.
  const RowSplit rows = SplitRows(n);
  const size_t own_offset = static_cast<size_t>(rows.begin) * c;

  if (llama) {
    backend_.RmsNormForward(a.norm1 + own_offset, a.norm1_rstd, in, params(w.norm1_w), rows.own, c,
                            config_.norm_eps);
  } else {
    backend_.LayerNormForward(a.norm1 + own_offset, a.norm1_mean, a.norm1_rstd, in,
                              params(w.norm1_w), params(w.norm1_b), rows.own, c, config_.norm_eps);
  }
  GatherNormOutput(a.norm1, rows);
  backend_.LinearForward(a.qkv, a.norm1, params(w.qkv_w), params(w.qkv_b), n, c, shape.qkv_width());
  if (llama) backend_.RopeForward(a.qkv, shape, config_.rope_theta, 0, positions);
  backend_.AttentionForward(a.attn, a.lse, a.qkv, shape, positions);
  // resid_mid = in + the attention branch, the add fused into norm2 where the branch is whole.
  const ConstValues attn_branch =
      ProjectBranch(a.resid_mid, in, a.attn, params(w.attn_out_w), params(w.attn_out_b), rows, hd);

  if (llama) {
    if (attn_branch.null()) {
      backend_.RmsNormForward(a.norm2 + own_offset, a.norm2_rstd, a.resid_mid, params(w.norm2_w),
                              rows.own, c, config_.norm_eps);
    } else {
      backend_.AddRmsNormForward(a.resid_mid, a.norm2 + own_offset, a.norm2_rstd, in, attn_branch,
                                 params(w.norm2_w), rows.own, c, config_.norm_eps);
    }
    GatherNormOutput(a.norm2, rows);
    backend_.LinearForward(a.mlp_up, a.norm2, params(w.mlp_up_w), nullptr, n, c, 2 * f);
    backend_.SwiGluForward(a.mlp_act, a.mlp_up, n, f);
  } else {
    if (attn_branch.null()) {
      backend_.LayerNormForward(a.norm2 + own_offset, a.norm2_mean, a.norm2_rstd, a.resid_mid,
                                params(w.norm2_w), params(w.norm2_b), rows.own, c,
                                config_.norm_eps);
    } else {
      backend_.AddLayerNormForward(a.resid_mid, a.norm2 + own_offset, a.norm2_mean, a.norm2_rstd,
                                   in, attn_branch, params(w.norm2_w), params(w.norm2_b), rows.own,
                                   c, config_.norm_eps);
    }
    GatherNormOutput(a.norm2, rows);
    backend_.LinearGeluForward(a.mlp_act, a.mlp_up, a.norm2, params(w.mlp_up_w), params(w.mlp_up_b),
                               n, c, f);
  }
  if (out.null()) return;
  RowParallelResidual(out, a.resid_mid, a.mlp_act, params(w.mlp_down_w), params(w.mlp_down_b), rows,
                      f);
}

void Transformer::BlockBackward(int layer, const ParamView& params, const GradView& grads,
                                BlockActivations& a, ConstValues in, Values dresid, int b, int t,
                                const int32_t* positions) {
  const BlockOffsets& w = table_.block(layer);
  const int n = b * t;
  const int c = dims_.d_model;
  const int hd = dims_.attn_width();
  const AttentionShape shape = Shape(b, t);
  const int f = dims_.mlp_width;
  const bool llama = config_.family == ModelFamily::kLlama;
  // dresid and the norms cover this rank's rows; the row-parallel layers' output gradients
  // (their bias gradients then complete on every rank) and everything between cover all n.
  const RowSplit rows = SplitRows(n);
  BeginNormGrads();

  // MLP branch: out = resid_mid + down(act(up(norm2(resid_mid)))).
  const ConstValues d_mlp_out = BranchOutputGrad(dresid, rows);
  if (llama) {
    backend_.LinearBackward(d_mlp_act_, grads(w.mlp_down_w), grads(w.mlp_down_b), d_mlp_out,
                            a.mlp_act, params(w.mlp_down_w), n, f, c);
    backend_.SwiGluBackward(d_mlp_up_, a.mlp_up, d_mlp_act_, n, f);
  } else {
    backend_.LinearBackwardThroughGelu(d_mlp_up_, grads(w.mlp_down_w), grads(w.mlp_down_b),
                                       d_mlp_out, a.mlp_act, a.mlp_up, params(w.mlp_down_w), n, f,
                                       c);
  }
  backend_.LinearBackward(d_norm_, grads(w.mlp_up_w), grads(w.mlp_up_b), d_mlp_up_, a.norm2,
                          params(w.mlp_up_w), n, c, dims_.mlp_up_width);
  const ConstValues dnorm2 = NormOutputGrad(rows);  // f: before the column-parallel up
  if (llama) {
    backend_.RmsNormBackward(dresid, NormGrad(grads, w.norm2_w, 0), dnorm2, a.resid_mid,
                             params(w.norm2_w), a.norm2_rstd, rows.own, c);
  } else {
    backend_.LayerNormBackward(dresid, NormGrad(grads, w.norm2_w, 0), NormGrad(grads, w.norm2_b, 2),
                               dnorm2, a.resid_mid, params(w.norm2_w), a.norm2_mean, a.norm2_rstd,
                               rows.own, c);
  }

  // Attention branch: resid_mid = in + out_proj(attention(rope(qkv(norm1(in))))).
  backend_.LinearBackward(d_attn_, grads(w.attn_out_w), grads(w.attn_out_b),
                          BranchOutputGrad(dresid, rows), a.attn, params(w.attn_out_w), n, hd, c);
  backend_.AttentionBackward(d_qkv_, d_attn_, a.qkv, a.attn, a.lse, shape, positions);
  if (llama) backend_.RopeBackward(d_qkv_, shape, config_.rope_theta, 0, positions);
  // Each rank holding a replicated kv head computed its query heads' share of the head's
  // gradient: the shares are summed before they join the accumulated gradient. (GPT-2 never
  // replicates: its kv heads are its heads, which split evenly.)
  const size_t qkv_weight_size = static_cast<size_t>(shape.qkv_width()) * c;
  float* dqkv_weight = d_qkv_weight_ != nullptr ? d_qkv_weight_ : grads(w.qkv_w);
  if (d_qkv_weight_ != nullptr) backend_.Zero(d_qkv_weight_, qkv_weight_size);
  backend_.LinearBackward(d_norm_, dqkv_weight, grads(w.qkv_b), d_qkv_, a.norm1, params(w.qkv_w), n,
                          c, shape.qkv_width());
  if (d_qkv_weight_ != nullptr) {
    const size_t q_size = static_cast<size_t>(hd) * c;
    tp_.ReduceKvReplicas(d_qkv_weight_ + q_size, qkv_weight_size - q_size);
    backend_.Add(grads(w.qkv_w), grads(w.qkv_w), d_qkv_weight_, qkv_weight_size);
  }
  const ConstValues dnorm1 = NormOutputGrad(rows);  // f: before the column-parallel qkv
  if (llama) {
    backend_.RmsNormBackward(dresid, NormGrad(grads, w.norm1_w, 1), dnorm1, in, params(w.norm1_w),
                             a.norm1_rstd, rows.own, c);
  } else {
    backend_.LayerNormBackward(dresid, NormGrad(grads, w.norm1_w, 1), NormGrad(grads, w.norm1_b, 3),
                               dnorm1, in, params(w.norm1_w), a.norm1_mean, a.norm1_rstd, rows.own,
                               c);
  }
  FinishNormGrads(grads, {w.norm2_w, w.norm1_w, w.norm2_b, w.norm1_b});
}

void Transformer::Classifier(Values dx, float* dhead, const int32_t* host_targets, int n,
                             float grad_scale, double* loss_sum) {
  backend_.CopyFromHost(staged_targets_, host_targets, static_cast<size_t>(n) * sizeof(int32_t));
  const int32_t* targets = staged_targets_;
  const int c = config_.d_model;
  if (!dims_.vocab_parallel) {
    backend_.ClassifierForwardBackward(dx, dhead, final_norm_, HeadWeight(), targets, n, c,
                                       config_.vocab_size, grad_scale, loss_sum);
    return;
  }
  const int v = dims_.vocab_rows();  // may be 0: this rank's slot is all padding
  const ConstValues weight = HeadWeight();
  for (int r0 = 0; r0 < n; r0 += vocab_chunk_rows_) {
    const int rows = std::min(vocab_chunk_rows_, n - r0);
    const ConstValues x = final_norm_ + static_cast<size_t>(r0) * c;
    const int32_t* chunk_targets = targets + r0;
    float* max = vocab_stats_;  // (rows)
    float* sums = max + rows;   // (rows), then target_logits (rows)
    float* target_logits = sums + rows;
    if (v > 0) backend_.LinearForward(vocab_logits_, x, weight, nullptr, rows, c, v);
    backend_.ClassifierRowMax(max, vocab_logits_, rows, v);
    tp_.VocabMax(max, rows);
    backend_.ClassifierExpSums(vocab_logits_, sums, target_logits, max, chunk_targets, rows, v,
                               dims_.vocab_begin);
    tp_.VocabSum(sums, 2 * static_cast<size_t>(rows));
    backend_.ClassifierLossSum(max, sums, target_logits, chunk_targets, rows, loss_sum);
    if (dx.null()) continue;
    const Values dx_chunk = dx + static_cast<size_t>(r0) * c;
    if (v == 0) {
      backend_.Zero(dx_chunk, static_cast<size_t>(rows) * c);
      continue;
    }
    backend_.ClassifierLogitsBackward(vocab_logits_, sums, chunk_targets, rows, v,
                                      dims_.vocab_begin, grad_scale);
    backend_.LinearBackward(dx_chunk, dhead, nullptr, vocab_logits_, x, weight, rows, c, v);
  }
}

void Transformer::ForwardBlocks(int slot_index, const StageForwardArgs& args, Values output) {
  Slot& slot = slots_[slot_index];
  slot.chunk = args.chunk;
  slot.b = args.b;
  slot.t = args.t;
  const int b = args.b, t = args.t;
  slot.positions = nullptr;
  if (args.positions != nullptr) {
    backend_.CopyFromHost(slot.staged_positions, args.positions,
                          static_cast<size_t>(b) * t * sizeof(int32_t));
    slot.positions = slot.staged_positions;
  }
  const RowSplit rows = SplitRows(b * t);
  const BlockSpan& blocks = chunks_[args.chunk];
  if (StartsModel(args.chunk)) {
    // The token ids move to the backend's memory once a micro-batch, for the embedding's forward
    // now and its backward later.
    backend_.CopyFromHost(slot.staged_tokens, args.tokens,
                          static_cast<size_t>(b) * t * sizeof(int32_t));
    slot.tokens = slot.staged_tokens;
    embeddings_ = Params(-1, Pass::kForward);
    EmbeddingForward(slot.tokens, slot.positions, b, t, rows, slot.inputs[0]);
    if (!head_is_embedding_) parameters_.Release(-1, Pass::kForward);
  } else {
    backend_.Convert(slot.inputs[0], args.input, static_cast<size_t>(rows.own) * config_.d_model);
  }
  for (int i = 0; i < blocks.count; ++i) {
    const int layer = blocks.first + i;
    const Values out = i + 1 < blocks.count ? slot.inputs[i + 1] : output;
    BlockForward(layer, Params(layer, Pass::kForward), ActivationsFor(slot_index, i),
                 slot.inputs[i], out, b, t, slot.positions);
    parameters_.Release(layer, Pass::kForward);
  }
}

void Transformer::FinalNormForward(const RowSplit& rows) {
  const int c = config_.d_model;
  final_region_ = Params(last_region_, Pass::kForward);
  const ParamView& params = final_region_;
  // On this rank's rows, gathered for the head (which runs on all rows).
  const Values own = final_norm_ + static_cast<size_t>(rows.begin) * c;
  if (config_.family == ModelFamily::kLlama) {
    backend_.RmsNormForward(own, final_rstd_, last_output_, params(table_.final_norm_w()), rows.own,
                            c, config_.norm_eps);
  } else {
    backend_.LayerNormForward(own, final_mean_, final_rstd_, last_output_,
                              params(table_.final_norm_w()), params(table_.final_norm_b()),
                              rows.own, c, config_.norm_eps);
  }
  GatherNormOutput(final_norm_, rows);
}

void Transformer::Forward(const int32_t* inputs, const int32_t* positions, int b, int t) {
  ForwardBlocks(0, {.b = b, .t = t, .tokens = inputs, .positions = positions}, last_output_);
  FinalNormForward(SplitRows(b * t));
}

ConstValues Transformer::HeadWeight() const {
  return head_is_embedding_ ? embeddings_(table_.head()) : final_region_(table_.head());
}

void Transformer::ReleaseHead() {
  parameters_.Release(last_region_, Pass::kForward);
  if (head_is_embedding_) parameters_.Release(-1, Pass::kForward);
}

void Transformer::LossBackward(const int32_t* targets, const RowSplit& rows, float grad_scale,
                               Values d_last) {
  const int c = config_.d_model;
  const ParamView& params = final_region_;
  const GradView grads = Grads(last_region_);
  // The head's gradient: the token embedding's when it is that tensor (complete only after the
  // embedding backward, at the very end).
  float* dhead = head_is_embedding_ ? Grads(-1)(table_.head()) : grads(table_.head());
  // The classifier's backward runs with its forward, so the (N, V) logits never exist whole.
  Classifier(d_norm_, dhead, targets, rows.n, grad_scale, TrainingLossSum());
  // f of the column-parallel head: every rank's share of d(final norm output), summed.
  const ConstValues dnorm = NormOutputGrad(rows);
  backend_.Zero(d_last, static_cast<size_t>(rows.own) * c);
  BeginNormGrads();
  if (config_.family == ModelFamily::kLlama) {
    backend_.RmsNormBackward(d_last, NormGrad(grads, table_.final_norm_w(), 0), dnorm, last_output_,
                             params(table_.final_norm_w()), final_rstd_, rows.own, c);
  } else {
    backend_.LayerNormBackward(d_last, NormGrad(grads, table_.final_norm_w(), 0),
                               NormGrad(grads, table_.final_norm_b(), 1), dnorm, last_output_,
                               params(table_.final_norm_w()), final_mean_, final_rstd_, rows.own,
                               c);
  }
  FinishNormGrads(grads, {table_.final_norm_w(), table_.final_norm_b()});
  parameters_.GradientsReady(last_region_);
  ReleaseHead();
}

void Transformer::StageForward(int slot, const StageForwardArgs& args) {
  if (!EndsModel(args.chunk)) {
    ForwardBlocks(slot, args, args.output);
    return;
  }
  ForwardBlocks(slot, args, last_output_);
  const RowSplit rows = SplitRows(args.b * args.t);
  FinalNormForward(rows);
  LossBackward(args.targets, rows, args.grad_scale, slots_[slot].d_last);
}

double Transformer::StageForwardLoss(const StageForwardArgs& args) {
  if (!EndsModel(args.chunk)) {
    ForwardBlocks(0, args, args.output);
    return 0;
  }
  ForwardBlocks(0, args, last_output_);
  const int n = args.b * args.t;
  FinalNormForward(SplitRows(n));
  const double loss = EvaluationLoss(args.targets, n);
  ReleaseHead();
  return loss;
}

void Transformer::StageBackward(int slot_index, ConstValues d_output, Values d_input) {
  Slot& slot = slots_[slot_index];
  const int b = slot.b, t = slot.t;
  const RowSplit rows = SplitRows(b * t);
  const BlockSpan& blocks = chunks_[slot.chunk];
  const bool embedding = StartsModel(slot.chunk);
  // The gradient runs back through the blocks in place: in d_input when the previous stage
  // takes it, else in the scratch.
  const Values dresid = embedding || d_input.null() ? d_resid_ : d_input;
  const ConstValues d_stage_output = EndsModel(slot.chunk) ? slot.d_last : d_output;
  if (d_stage_output.data() != dresid.data()) {
    backend_.Convert(dresid, d_stage_output, static_cast<size_t>(rows.own) * config_.d_model);
  }
  for (int i = blocks.count - 1; i >= 0; --i) {
    const int layer = blocks.first + i;
    BlockActivations& a = ActivationsFor(slot_index, i);
    const ParamView block_params = Params(layer, Pass::kBackward);
    if (recompute_ == Recompute::kFull) {
      BlockForward(layer, block_params, a, slot.inputs[i], nullptr, b, t, slot.positions);
    }
    if (recompute_ == Recompute::kSelective) {
      backend_.AttentionForward(a.attn, a.lse, a.qkv, Shape(b, t), slot.positions);
    }
    BlockBackward(layer, block_params, Grads(layer), a, slot.inputs[i], dresid, b, t,
                  slot.positions);
    parameters_.GradientsReady(layer);
    parameters_.Release(layer, Pass::kBackward);
  }
  if (embedding) {
    EmbeddingBackward(slot.tokens, slot.positions, b, t, rows, dresid);
    parameters_.GradientsReady(-1);
  }
}

void Transformer::ForwardBackward(const int32_t* inputs, const int32_t* targets, int b, int t,
                                  float grad_scale, const int32_t* positions) {
  StageForward(0, {.b = b,
                   .t = t,
                   .tokens = inputs,
                   .targets = targets,
                   .grad_scale = grad_scale,
                   .positions = positions});
  StageBackward(0, nullptr, nullptr);
}

double Transformer::TakeLossSum() { return ReadAndZero(TrainingLossSum()); }

double Transformer::ReadAndZero(double* scalar) {
  const double value = ReadScalar(backend_, scalar);
  ZeroScalar(backend_, scalar);
  return value;
}

double Transformer::EvaluationLoss(const int32_t* host_targets, int n) {
  double* loss_sum = static_cast<double*>(loss_sums_.data()) + 1;
  Classifier(nullptr, nullptr, host_targets, n, 0.0f, loss_sum);
  return ReadAndZero(loss_sum);
}

double Transformer::ForwardLoss(const int32_t* inputs, const int32_t* targets, int b, int t,
                                const int32_t* positions) {
  Forward(inputs, positions, b, t);
  const double loss = EvaluationLoss(targets, b * t);
  ReleaseHead();
  return loss;
}

void Transformer::ForwardLogits(const int32_t* inputs, int b, int t, bool last_only, float* logits,
                                const int32_t* positions) {
  StageForwardLogits({.b = b, .t = t, .tokens = inputs, .positions = positions}, last_only, logits);
}

void Transformer::StageForwardLogits(const StageForwardArgs& args, bool last_only, float* logits) {
  if (!EndsModel(args.chunk)) {
    ForwardBlocks(0, args, args.output);
    return;
  }
  ForwardBlocks(0, args, last_output_);
  const int b = args.b, t = args.t;
  FinalNormForward(SplitRows(b * t));
  const int c = config_.d_model;
  const int v = config_.vocab_size;
  const int rows = last_only ? b : b * t;
  // Output row r's input: the final norm of its token.
  auto input_row = [&](int r) {
    return final_norm_ + (last_only ? static_cast<size_t>(r) * t + t - 1 : r) * c;
  };
  if (!dims_.vocab_parallel) {
    // Computed in the backend's memory (sampling is rare: a buffer for the call), read on the host.
    const DeviceBuffer computed = backend_.Allocate(static_cast<size_t>(rows) * v);
    if (last_only) {
      for (int i = 0; i < b; ++i) {
        backend_.LinearForward(computed.floats() + static_cast<size_t>(i) * v, input_row(i),
                               HeadWeight(), nullptr, 1, c, v);
      }
    } else {
      backend_.LinearForward(computed.floats(), final_norm_, HeadWeight(), nullptr, b * t, c, v);
    }
    backend_.CopyToHost(logits, computed.data(), computed.bytes());
    ReleaseHead();
    return;
  }
  // Each rank computes its slot's real logits; the slots, gathered in rank order, are the
  // padded vocabulary, of which the first V columns are the real tokens.
  const int slot = dims_.vocab_slot;
  const int local_v = dims_.vocab_rows();
  const int tp = table_.slice().tp_size;
  // The slots travel in backend memory (the tp group's collectives run there).
  DeviceBuffer local =
      backend_.Allocate(static_cast<size_t>(std::min(rows, vocab_chunk_rows_)) * slot);
  DeviceBuffer gathered = backend_.Allocate(local.size() * tp);
  std::vector<float> all(gathered.size());
  for (int r0 = 0; r0 < rows; r0 += vocab_chunk_rows_) {
    const int chunk = std::min(vocab_chunk_rows_, rows - r0);
    if (local_v > 0 && last_only) {
      for (int i = 0; i < chunk; ++i) {
        backend_.LinearForward(vocab_logits_ + static_cast<size_t>(i) * local_v, input_row(r0 + i),
                               HeadWeight(), nullptr, 1, c, local_v);
      }
    } else if (local_v > 0) {
      backend_.LinearForward(vocab_logits_, input_row(r0), HeadWeight(), nullptr, chunk, c,
                             local_v);
    }
    for (int i = 0; i < chunk; ++i) {  // widened to float32 at bf16 activations
      backend_.Convert(local.floats() + static_cast<size_t>(i) * slot,
                       vocab_logits_ + static_cast<size_t>(i) * local_v, local_v);
    }
    tp_.GatherRows(local.floats(), gathered.floats(), static_cast<size_t>(chunk) * slot);
    backend_.CopyToHost(all.data(), gathered.floats(),
                        static_cast<size_t>(chunk) * slot * tp * sizeof(float));
    for (int rank = 0; rank < tp; ++rank) {
      const int begin = std::min(v, rank * slot), end = std::min(v, (rank + 1) * slot);
      for (int i = 0; i < chunk; ++i) {
        const float* from = all.data() + (static_cast<size_t>(rank) * chunk + i) * slot;
        std::copy(from, from + (end - begin), logits + static_cast<size_t>(r0 + i) * v + begin);
      }
    }
  }
  ReleaseHead();
}

}  // namespace dtrain
