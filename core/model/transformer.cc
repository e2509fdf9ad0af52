#include "core/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace dtrain {
namespace {
constexpr size_t kAbsent = std::numeric_limits<size_t>::max();

// The vocabulary-parallel classifier's chunk rows for micro-batches of up to max_tokens (0 at
// tp = 1, whose fused kernel keeps its chunk in the backend's scratch).
int VocabChunkCapacity(const LocalDims& dims, int max_tokens) {
  return dims.vocab_parallel ? std::min(max_tokens, Transformer::VocabChunkRows(dims.vocab_slot))
                             : 0;
}

// The activation arena's size in floats: in size_t to allocate it, in double to check a size
// before allocating without overflow (AllocateActivations lays it out in this order).
template <typename T>
T ArenaFloats(const ModelConfig& config, const LocalDims& dims, int max_batch, int max_time,
              Recompute recompute) {
  const T n = static_cast<T>(max_batch) * static_cast<T>(max_time);
  const T c = static_cast<T>(dims.d_model);
  const T hd = static_cast<T>(dims.attn_width());
  const T qkv = static_cast<T>(dims.qkv_width());
  const T f = static_cast<T>(dims.mlp_width);
  const T up = static_cast<T>(dims.mlp_up_width);
  const T lse = static_cast<T>(max_batch) * static_cast<T>(dims.heads) * max_time;
  const T core = n * hd + lse;  // the attention core's output and log-sum-exp
  const T per_block = n * (4 * c + 4 + qkv + up + f);
  const T saved_blocks = static_cast<T>(recompute == Recompute::kFull ? 1 : config.n_layer);
  const T saved_cores = static_cast<T>(recompute == Recompute::kNone ? config.n_layer : 1);
  const T qkv_weight_grad = dims.kv_replicas > 1 ? qkv * c : 0;
  const T vocab_rows = static_cast<T>(VocabChunkCapacity(dims, max_batch * max_time));
  return (static_cast<T>(config.n_layer) + 1) * n * c  // block inputs and the last output
         + saved_blocks * per_block                    // saved activations
         + saved_cores * core                          // saved attention cores
         + n * (c + 2)                                 // final norm
         + n * (3 * c + qkv + hd + up + f)             // backward scratch, branch output
         + qkv_weight_grad                             // replicated kv heads' weight gradient
         + vocab_rows * (dims.vocab_rows() + 3);       // vocabulary-parallel logits and stats
}

}  // namespace

int Transformer::VocabChunkRows(int vocab_slot) {
  constexpr size_t kBudgetValues = (size_t{128} << 20) / sizeof(float);
  const size_t rows = kBudgetValues / static_cast<size_t>(std::max(vocab_slot, 1));
  if (rows >= (size_t{1} << 30)) return 1 << 30;
  return std::max(128, static_cast<int>(rows / 64 * 64));
}

double Transformer::ActivationBytes(const ModelConfig& config, int max_batch, int max_time,
                                    Recompute recompute, const ModelSlice& slice) {
  return ArenaFloats<double>(config, LocalDimsOf(config, slice), max_batch, max_time, recompute) *
         sizeof(float);
}

Transformer::Transformer(const ModelConfig& config, const ParamTable& table,
                         BlockParameters& parameters, Backend& backend, int max_batch, int max_time,
                         Recompute recompute, TensorParallelOps* tensor_parallel)
    : config_(config),
      table_(table),
      dims_(table.dims()),
      tp_(tensor_parallel != nullptr ? *tensor_parallel : no_tensor_parallel_),
      parameters_(parameters),
      backend_(backend),
      recompute_(recompute),
      last_region_(table.last_region()) {
  AllocateActivations(max_batch, max_time);
}

float* Transformer::RegionView::operator()(size_t offset) const {
  return offset == kAbsent ? nullptr : base + (offset - begin);
}

Transformer::RegionView Transformer::Params(int region, Pass pass) {
  // Parameters are never written through the view; the const_cast only lets one view type
  // serve parameters and gradients.
  return {const_cast<float*>(parameters_.Acquire(region, pass)), table_.BlockRange(region).first};
}

Transformer::RegionView Transformer::Grads(int region) {
  return {parameters_.Gradients(region), table_.BlockRange(region).first};
}

AttentionShape Transformer::Shape(int b, int t) const {
  return AttentionShape{b, t, dims_.heads, dims_.kv_heads, dims_.head_dim};
}

void Transformer::RowParallelForward(float* out, const float* inp, const float* weight,
                                     const float* bias, int n, int in_features) {
  const int c = dims_.d_model;
  if (table_.slice().tp_size == 1) {  // nothing to sum: the GEMM adds the bias in its pass
    backend_.LinearForward(out, inp, weight, bias, n, in_features, c);
    return;
  }
  backend_.LinearForward(out, inp, weight, nullptr, n, in_features, c);
  tp_.ReduceForward(out, static_cast<size_t>(n) * c);
  if (bias != nullptr) backend_.AddBias(out, bias, n, c);
}

void Transformer::AllocateActivations(int max_batch, int max_time) {
  const size_t n = static_cast<size_t>(max_batch) * max_time;
  max_tokens_ = static_cast<int>(n);
  const size_t c = dims_.d_model;
  const size_t hd = dims_.attn_width();
  const size_t qkv = dims_.qkv_width();
  const size_t f = dims_.mlp_width;
  const size_t up = dims_.mlp_up_width;
  const size_t lse = static_cast<size_t>(max_batch) * dims_.heads * max_time;
  const size_t qkv_weight_grad = dims_.kv_replicas > 1 ? qkv * c : 0;
  const int saved_blocks = recompute_ == Recompute::kFull ? 1 : config_.n_layer;
  const int saved_cores = recompute_ == Recompute::kNone ? config_.n_layer : 1;
  acts_.assign(ArenaFloats<size_t>(config_, dims_, max_batch, max_time, recompute_), 0.0f);

  float* cursor = acts_.data();
  auto take = [&cursor](size_t count) {
    float* p = cursor;
    cursor += count;
    return p;
  };
  resid_.clear();
  for (int l = 0; l <= config_.n_layer; ++l) resid_.push_back(take(n * c));
  blocks_.assign(saved_blocks, BlockActivations{});
  for (BlockActivations& a : blocks_) {
    a.norm1 = take(n * c);
    a.norm1_mean = take(n);
    a.norm1_rstd = take(n);
    a.qkv = take(n * qkv);
    a.resid_mid = take(n * c);
    a.norm2 = take(n * c);
    a.norm2_mean = take(n);
    a.norm2_rstd = take(n);
    a.mlp_up = take(n * up);
    a.mlp_act = take(n * f);
  }
  // Under kSelective every block shares core 0; otherwise block i has core i.
  for (int i = 0; i < saved_cores; ++i) {
    float* attn = take(n * hd);
    float* lse_values = take(lse);
    for (size_t j = i; j < blocks_.size(); j += saved_cores) {
      blocks_[j].attn = attn;
      blocks_[j].lse = lse_values;
    }
  }
  final_norm_ = take(n * c);
  final_mean_ = take(n);
  final_rstd_ = take(n);
  d_resid_ = take(n * c);
  d_norm_ = take(n * c);
  d_qkv_ = take(n * qkv);
  d_attn_ = take(n * hd);
  d_mlp_up_ = take(n * up);
  d_mlp_act_ = take(n * f);
  branch_out_ = take(n * c);
  d_qkv_weight_ = qkv_weight_grad > 0 ? take(qkv_weight_grad) : nullptr;
  vocab_chunk_rows_ = VocabChunkCapacity(dims_, max_tokens_);
  vocab_logits_ = take(static_cast<size_t>(vocab_chunk_rows_) * dims_.vocab_rows());
  vocab_stats_ = take(3 * static_cast<size_t>(vocab_chunk_rows_));
}

Transformer::BlockActivations& Transformer::ActivationsFor(int layer) {
  return blocks_[recompute_ == Recompute::kFull ? 0 : layer];
}

void Transformer::BlockForward(int layer, const RegionView& params, BlockActivations& a,
                               const float* in, float* out, int b, int t) {
  const BlockOffsets& w = table_.block(layer);
  const int n = b * t;
  const int c = dims_.d_model;
  const int hd = dims_.attn_width();
  const AttentionShape shape = Shape(b, t);
  const int f = dims_.mlp_width;
  const bool llama = config_.family == ModelFamily::kLlama;

  if (llama) {
    backend_.RmsNormForward(a.norm1, a.norm1_rstd, in, params(w.norm1_w), n, c, config_.norm_eps);
  } else {
    backend_.LayerNormForward(a.norm1, a.norm1_mean, a.norm1_rstd, in, params(w.norm1_w),
                              params(w.norm1_b), n, c, config_.norm_eps);
  }
  backend_.LinearForward(a.qkv, a.norm1, params(w.qkv_w), params(w.qkv_b), n, c, shape.qkv_width());
  if (llama) backend_.RopeForward(a.qkv, shape, config_.rope_theta, 0);
  backend_.AttentionForward(a.attn, a.lse, a.qkv, shape);
  RowParallelForward(branch_out_, a.attn, params(w.attn_out_w), params(w.attn_out_b), n, hd);
  backend_.Add(a.resid_mid, in, branch_out_, static_cast<size_t>(n) * c);

  if (llama) {
    backend_.RmsNormForward(a.norm2, a.norm2_rstd, a.resid_mid, params(w.norm2_w), n, c,
                            config_.norm_eps);
    backend_.LinearForward(a.mlp_up, a.norm2, params(w.mlp_up_w), nullptr, n, c, 2 * f);
    backend_.SwiGluForward(a.mlp_act, a.mlp_up, n, f);
  } else {
    backend_.LayerNormForward(a.norm2, a.norm2_mean, a.norm2_rstd, a.resid_mid, params(w.norm2_w),
                              params(w.norm2_b), n, c, config_.norm_eps);
    backend_.LinearForward(a.mlp_up, a.norm2, params(w.mlp_up_w), params(w.mlp_up_b), n, c, f);
    backend_.GeluForward(a.mlp_act, a.mlp_up, static_cast<size_t>(n) * f);
  }
  if (out == nullptr) return;
  RowParallelForward(branch_out_, a.mlp_act, params(w.mlp_down_w), params(w.mlp_down_b), n, f);
  backend_.Add(out, a.resid_mid, branch_out_, static_cast<size_t>(n) * c);
}

void Transformer::BlockBackward(int layer, const RegionView& params, const RegionView& grads,
                                BlockActivations& a, const float* in, float* dresid, int b, int t) {
  const BlockOffsets& w = table_.block(layer);
  const int n = b * t;
  const int c = dims_.d_model;
  const int hd = dims_.attn_width();
  const AttentionShape shape = Shape(b, t);
  const int f = dims_.mlp_width;
  const bool llama = config_.family == ModelFamily::kLlama;

  // MLP branch: out = resid_mid + down(act(up(norm2(resid_mid)))).
  backend_.LinearBackward(d_mlp_act_, grads(w.mlp_down_w), grads(w.mlp_down_b), dresid, a.mlp_act,
                          params(w.mlp_down_w), n, f, c);
  if (llama) {
    backend_.SwiGluBackward(d_mlp_up_, a.mlp_up, d_mlp_act_, n, f);
    backend_.LinearBackward(d_norm_, grads(w.mlp_up_w), nullptr, d_mlp_up_, a.norm2,
                            params(w.mlp_up_w), n, c, 2 * f);
    tp_.ReduceBackward(d_norm_, static_cast<size_t>(n) * c);  // f: before the column-parallel up
    backend_.RmsNormBackward(dresid, grads(w.norm2_w), d_norm_, a.resid_mid, params(w.norm2_w),
                             a.norm2_rstd, n, c);
  } else {
    backend_.GeluBackward(d_mlp_up_, a.mlp_up, d_mlp_act_, static_cast<size_t>(n) * f);
    backend_.LinearBackward(d_norm_, grads(w.mlp_up_w), grads(w.mlp_up_b), d_mlp_up_, a.norm2,
                            params(w.mlp_up_w), n, c, f);
    tp_.ReduceBackward(d_norm_, static_cast<size_t>(n) * c);
    backend_.LayerNormBackward(dresid, grads(w.norm2_w), grads(w.norm2_b), d_norm_, a.resid_mid,
                               params(w.norm2_w), a.norm2_mean, a.norm2_rstd, n, c);
  }

  // Attention branch: resid_mid = in + out_proj(attention(rope(qkv(norm1(in))))).
  backend_.LinearBackward(d_attn_, grads(w.attn_out_w), grads(w.attn_out_b), dresid, a.attn,
                          params(w.attn_out_w), n, hd, c);
  backend_.AttentionBackward(d_qkv_, d_attn_, a.qkv, a.attn, a.lse, shape);
  if (llama) backend_.RopeBackward(d_qkv_, shape, config_.rope_theta, 0);
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
  tp_.ReduceBackward(d_norm_, static_cast<size_t>(n) * c);  // f: before the column-parallel qkv
  if (llama) {
    backend_.RmsNormBackward(dresid, grads(w.norm1_w), d_norm_, in, params(w.norm1_w), a.norm1_rstd,
                             n, c);
  } else {
    backend_.LayerNormBackward(dresid, grads(w.norm1_w), grads(w.norm1_b), d_norm_, in,
                               params(w.norm1_w), a.norm1_mean, a.norm1_rstd, n, c);
  }
}

void Transformer::EmbeddingForward(const int32_t* inputs, int b, int t) {
  const int c = config_.d_model;
  const float* tokens = embeddings_(table_.token_embedding());
  const float* positions = embeddings_(table_.position_embedding());
  if (!dims_.vocab_parallel) {
    backend_.EmbeddingForward(resid_[0], inputs, tokens, positions, b, t, c, 0, config_.vocab_size);
    return;
  }
  // Exactly one rank looks up each token, so the sum adds only zeros to it: the embedding is
  // the single process's bit for bit (up to the sign of a zero).
  backend_.EmbeddingForward(resid_[0], inputs, tokens, nullptr, b, t, c, dims_.vocab_begin,
                            dims_.vocab_end);
  tp_.ReduceForward(resid_[0], static_cast<size_t>(b) * t * c);
  if (positions == nullptr) return;
  const size_t sequence = static_cast<size_t>(t) * c;
  for (int i = 0; i < b; ++i) {
    backend_.Add(resid_[0] + i * sequence, resid_[0] + i * sequence, positions, sequence);
  }
}

void Transformer::EmbeddingBackward(const int32_t* inputs, int b, int t) {
  const RegionView grads = Grads(-1);
  backend_.EmbeddingBackward(grads(table_.token_embedding()), grads(table_.position_embedding()),
                             d_resid_, inputs, b, t, config_.d_model, dims_.vocab_begin,
                             dims_.vocab_end);
}

double Transformer::Classifier(float* dx, float* dhead, const int32_t* targets, int n,
                               float grad_scale) {
  const int c = config_.d_model;
  if (!dims_.vocab_parallel) {
    return backend_.ClassifierForwardBackward(dx, dhead, final_norm_, HeadWeight(), targets, n, c,
                                              config_.vocab_size, grad_scale);
  }
  const int v = dims_.vocab_rows();  // may be 0: this rank's slot is all padding
  const float* weight = HeadWeight();
  double loss = 0;
  for (int r0 = 0; r0 < n; r0 += vocab_chunk_rows_) {
    const int rows = std::min(vocab_chunk_rows_, n - r0);
    const float* x = final_norm_ + static_cast<size_t>(r0) * c;
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
    loss += backend_.ClassifierLossSum(max, sums, target_logits, chunk_targets, rows);
    if (dx == nullptr) continue;
    float* dx_chunk = dx + static_cast<size_t>(r0) * c;
    if (v == 0) {
      backend_.Zero(dx_chunk, static_cast<size_t>(rows) * c);
      continue;
    }
    backend_.ClassifierLogitsBackward(vocab_logits_, sums, chunk_targets, rows, v,
                                      dims_.vocab_begin, grad_scale);
    backend_.LinearBackward(dx_chunk, dhead, nullptr, vocab_logits_, x, weight, rows, c, v);
  }
  // f of the column-parallel head: every rank's share of dx, summed.
  if (dx != nullptr) tp_.ReduceBackward(dx, static_cast<size_t>(n) * c);
  return loss;
}

void Transformer::Forward(const int32_t* inputs, int b, int t) {
  const int n = b * t;
  const int c = config_.d_model;
  embeddings_ = Params(-1, Pass::kForward);
  EmbeddingForward(inputs, b, t);
  if (!config_.tied_head()) parameters_.Release(-1, Pass::kForward);
  for (int l = 0; l < config_.n_layer; ++l) {
    BlockForward(l, Params(l, Pass::kForward), ActivationsFor(l), resid_[l], resid_[l + 1], b, t);
    parameters_.Release(l, Pass::kForward);
  }
  final_region_ = Params(last_region_, Pass::kForward);
  const RegionView& params = final_region_;
  const float* last = resid_[config_.n_layer];
  if (config_.family == ModelFamily::kLlama) {
    backend_.RmsNormForward(final_norm_, final_rstd_, last, params(table_.final_norm_w()), n, c,
                            config_.norm_eps);
  } else {
    backend_.LayerNormForward(final_norm_, final_mean_, final_rstd_, last,
                              params(table_.final_norm_w()), params(table_.final_norm_b()), n, c,
                              config_.norm_eps);
  }
}

const float* Transformer::HeadWeight() const {
  return config_.tied_head() ? embeddings_(table_.head()) : final_region_(table_.head());
}

void Transformer::ReleaseHead() {
  parameters_.Release(last_region_, Pass::kForward);
  if (config_.tied_head()) parameters_.Release(-1, Pass::kForward);
}

double Transformer::ForwardBackward(const int32_t* inputs, const int32_t* targets, int b, int t,
                                    float grad_scale) {
  Forward(inputs, b, t);
  const int n = b * t;
  const int c = config_.d_model;
  const RegionView& params = final_region_;
  const RegionView grads = Grads(last_region_);
  // The head's gradient: the token embedding's when tied (complete only after the embedding
  // backward, at the very end).
  float* dhead = config_.tied_head() ? Grads(-1)(table_.head()) : grads(table_.head());
  // The classifier's backward runs with its forward, so the (N, V) logits never exist whole.
  const double loss_sum = Classifier(d_norm_, dhead, targets, n, grad_scale);
  backend_.Zero(d_resid_, static_cast<size_t>(n) * c);
  const float* last = resid_[config_.n_layer];
  if (config_.family == ModelFamily::kLlama) {
    backend_.RmsNormBackward(d_resid_, grads(table_.final_norm_w()), d_norm_, last,
                             params(table_.final_norm_w()), final_rstd_, n, c);
  } else {
    backend_.LayerNormBackward(d_resid_, grads(table_.final_norm_w()), grads(table_.final_norm_b()),
                               d_norm_, last, params(table_.final_norm_w()), final_mean_,
                               final_rstd_, n, c);
  }
  parameters_.GradientsReady(last_region_);
  ReleaseHead();
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    BlockActivations& a = ActivationsFor(l);
    const RegionView block_params = Params(l, Pass::kBackward);
    if (recompute_ == Recompute::kFull) BlockForward(l, block_params, a, resid_[l], nullptr, b, t);
    if (recompute_ == Recompute::kSelective) {
      backend_.AttentionForward(a.attn, a.lse, a.qkv, Shape(b, t));
    }
    BlockBackward(l, block_params, Grads(l), a, resid_[l], d_resid_, b, t);
    parameters_.GradientsReady(l);
    parameters_.Release(l, Pass::kBackward);
  }
  EmbeddingBackward(inputs, b, t);
  parameters_.GradientsReady(-1);
  return loss_sum;
}

double Transformer::ForwardLoss(const int32_t* inputs, const int32_t* targets, int b, int t) {
  Forward(inputs, b, t);
  const double loss = Classifier(nullptr, nullptr, targets, b * t, 0.0f);
  ReleaseHead();
  return loss;
}

void Transformer::ForwardLogits(const int32_t* inputs, int b, int t, bool last_only,
                                float* logits) {
  Forward(inputs, b, t);
  const int c = config_.d_model;
  const int v = config_.vocab_size;
  const int rows = last_only ? b : b * t;
  // Output row r's input: the final norm of its token.
  auto input_row = [&](int r) {
    return final_norm_ + (last_only ? static_cast<size_t>(r) * t + t - 1 : r) * c;
  };
  if (!dims_.vocab_parallel) {
    if (last_only) {
      for (int i = 0; i < b; ++i) {
        backend_.LinearForward(logits + static_cast<size_t>(i) * v, input_row(i), HeadWeight(),
                               nullptr, 1, c, v);
      }
    } else {
      backend_.LinearForward(logits, final_norm_, HeadWeight(), nullptr, b * t, c, v);
    }
    ReleaseHead();
    return;
  }
  // Each rank computes its slot's real logits; the slots, gathered in rank order, are the
  // padded vocabulary, of which the first V columns are the real tokens.
  const int slot = dims_.vocab_slot;
  const int local_v = dims_.vocab_rows();
  const int tp = table_.slice().tp_size;
  std::vector<float> local(static_cast<size_t>(std::min(rows, vocab_chunk_rows_)) * slot);
  std::vector<float> all(local.size() * tp);
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
    for (int i = 0; i < chunk; ++i) {
      const float* row = vocab_logits_ + static_cast<size_t>(i) * local_v;
      std::copy(row, row + local_v, local.begin() + static_cast<size_t>(i) * slot);
    }
    tp_.GatherVocab(local.data(), all.data(), static_cast<size_t>(chunk) * slot);
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
