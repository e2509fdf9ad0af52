#include "core/model/transformer.h"

#include <cmath>
#include <limits>

#include "core/util/rng.h"

namespace dtrain {
namespace {
constexpr size_t kAbsent = std::numeric_limits<size_t>::max();

// FNV-1a of a tensor name: the random stream of that tensor, stable across builds and ranks.
uint64_t NameStream(const std::string& name) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char ch : name) hash = (hash ^ ch) * 0x100000001b3ULL;
  return hash;
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, Backend& backend, int max_batch,
                         int max_time, bool activation_checkpointing)
    : config_(config),
      backend_(backend),
      table_(config, ModelSlice{}),
      checkpointing_(activation_checkpointing),
      params_(table_.total_numel()),
      grads_(table_.total_numel()) {
  AllocateActivations(max_batch, max_time);
}

const float* Transformer::P(size_t offset) const {
  return offset == kAbsent ? nullptr : params_.data() + offset;
}
float* Transformer::G(size_t offset) { return offset == kAbsent ? nullptr : grads_.data() + offset; }

AttentionShape Transformer::Shape(int b, int t) const {
  return AttentionShape{b, t, config_.n_head, config_.n_kv_head, config_.head_dim};
}

void Transformer::AllocateActivations(int max_batch, int max_time) {
  const size_t n = static_cast<size_t>(max_batch) * max_time;
  max_tokens_ = static_cast<int>(n);
  const size_t c = config_.d_model;
  const size_t hd = static_cast<size_t>(config_.n_head) * config_.head_dim;
  const size_t qkv = Shape(1, 1).qkv_width();
  const size_t f = config_.d_ff;
  const size_t up = config_.family == ModelFamily::kLlama ? 2 * f : f;
  const size_t lse = static_cast<size_t>(max_batch) * config_.n_head * max_time;
  const size_t per_block = n * (4 * c + 4 + qkv + hd + up + f) + lse;
  const int saved_blocks = checkpointing_ ? 1 : config_.n_layer;
  const size_t total = (config_.n_layer + 1) * n * c        // block inputs and the last output
                       + saved_blocks * per_block           // saved activations
                       + n * (c + 2)                        // final norm
                       + n * (3 * c + qkv + hd + up + f);   // backward scratch, branch output
  acts_.assign(total, 0.0f);

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
    a.attn = take(n * hd);
    a.lse = take(lse);
    a.resid_mid = take(n * c);
    a.norm2 = take(n * c);
    a.norm2_mean = take(n);
    a.norm2_rstd = take(n);
    a.mlp_up = take(n * up);
    a.mlp_act = take(n * f);
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
}

Transformer::BlockActivations& Transformer::ActivationsFor(int layer) {
  return blocks_[checkpointing_ ? 0 : layer];
}

void Transformer::InitWeights(uint64_t seed) {
  const float residual_std =
      config_.init_std / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  for (const TensorEntry& entry : table_.entries()) {
    float* p = params_.data() + entry.offset;
    if (entry.is_bias) {
      std::fill(p, p + entry.numel, 0.0f);
    } else if (entry.is_norm_weight) {
      std::fill(p, p + entry.numel, 1.0f);
    } else {
      const float std = entry.residual_projection ? residual_std : config_.init_std;
      CounterRng rng(seed, NameStream(entry.name));
      for (size_t i = 0; i < entry.numel; ++i) p[i] = std * static_cast<float>(rng.normal());
    }
  }
}

void Transformer::BlockForward(int layer, BlockActivations& a, const float* in, float* out,
                               int b, int t) {
  const BlockOffsets& w = table_.block(layer);
  const int n = b * t;
  const int c = config_.d_model;
  const int hd = config_.n_head * config_.head_dim;
  const AttentionShape shape = Shape(b, t);
  const int f = config_.d_ff;
  const bool llama = config_.family == ModelFamily::kLlama;

  if (llama) {
    backend_.RmsNormForward(a.norm1, a.norm1_rstd, in, P(w.norm1_w), n, c, config_.norm_eps);
  } else {
    backend_.LayerNormForward(a.norm1, a.norm1_mean, a.norm1_rstd, in, P(w.norm1_w),
                              P(w.norm1_b), n, c, config_.norm_eps);
  }
  backend_.LinearForward(a.qkv, a.norm1, P(w.qkv_w), P(w.qkv_b), n, c, shape.qkv_width());
  if (llama) backend_.RopeForward(a.qkv, shape, config_.rope_theta, 0);
  backend_.AttentionForward(a.attn, a.lse, a.qkv, shape);
  backend_.LinearForward(branch_out_, a.attn, P(w.attn_out_w), P(w.attn_out_b), n, hd, c);
  backend_.Add(a.resid_mid, in, branch_out_, static_cast<size_t>(n) * c);

  if (llama) {
    backend_.RmsNormForward(a.norm2, a.norm2_rstd, a.resid_mid, P(w.norm2_w), n, c,
                            config_.norm_eps);
    backend_.LinearForward(a.mlp_up, a.norm2, P(w.mlp_up_w), nullptr, n, c, 2 * f);
    backend_.SwiGluForward(a.mlp_act, a.mlp_up, n, f);
  } else {
    backend_.LayerNormForward(a.norm2, a.norm2_mean, a.norm2_rstd, a.resid_mid, P(w.norm2_w),
                              P(w.norm2_b), n, c, config_.norm_eps);
    backend_.LinearForward(a.mlp_up, a.norm2, P(w.mlp_up_w), P(w.mlp_up_b), n, c, f);
    backend_.GeluForward(a.mlp_act, a.mlp_up, static_cast<size_t>(n) * f);
  }
  if (out == nullptr) return;
  backend_.LinearForward(branch_out_, a.mlp_act, P(w.mlp_down_w), P(w.mlp_down_b), n, f, c);
  backend_.Add(out, a.resid_mid, branch_out_, static_cast<size_t>(n) * c);
}

void Transformer::BlockBackward(int layer, BlockActivations& a, const float* in, float* dresid,
                                int b, int t) {
  const BlockOffsets& w = table_.block(layer);
  const int n = b * t;
  const int c = config_.d_model;
  const int hd = config_.n_head * config_.head_dim;
  const AttentionShape shape = Shape(b, t);
  const int f = config_.d_ff;
  const bool llama = config_.family == ModelFamily::kLlama;

  // MLP branch: out = resid_mid + down(act(up(norm2(resid_mid)))).
  backend_.LinearBackward(d_mlp_act_, G(w.mlp_down_w), G(w.mlp_down_b), dresid, a.mlp_act,
                          P(w.mlp_down_w), n, f, c);
  if (llama) {
    backend_.SwiGluBackward(d_mlp_up_, a.mlp_up, d_mlp_act_, n, f);
    backend_.LinearBackward(d_norm_, G(w.mlp_up_w), nullptr, d_mlp_up_, a.norm2, P(w.mlp_up_w),
                            n, c, 2 * f);
    backend_.RmsNormBackward(dresid, G(w.norm2_w), d_norm_, a.resid_mid, P(w.norm2_w),
                             a.norm2_rstd, n, c);
  } else {
    backend_.GeluBackward(d_mlp_up_, a.mlp_up, d_mlp_act_, static_cast<size_t>(n) * f);
    backend_.LinearBackward(d_norm_, G(w.mlp_up_w), G(w.mlp_up_b), d_mlp_up_, a.norm2,
                            P(w.mlp_up_w), n, c, f);
    backend_.LayerNormBackward(dresid, G(w.norm2_w), G(w.norm2_b), d_norm_, a.resid_mid,
                               P(w.norm2_w), a.norm2_mean, a.norm2_rstd, n, c);
  }

  // Attention branch: resid_mid = in + out_proj(attention(rope(qkv(norm1(in))))).
  backend_.LinearBackward(d_attn_, G(w.attn_out_w), G(w.attn_out_b), dresid, a.attn,
                          P(w.attn_out_w), n, hd, c);
  backend_.AttentionBackward(d_qkv_, d_attn_, a.qkv, a.attn, a.lse, shape);
  if (llama) backend_.RopeBackward(d_qkv_, shape, config_.rope_theta, 0);
  backend_.LinearBackward(d_norm_, G(w.qkv_w), G(w.qkv_b), d_qkv_, a.norm1, P(w.qkv_w), n, c,
                          shape.qkv_width());
  if (llama) {
    backend_.RmsNormBackward(dresid, G(w.norm1_w), d_norm_, in, P(w.norm1_w), a.norm1_rstd, n,
                             c);
  } else {
    backend_.LayerNormBackward(dresid, G(w.norm1_w), G(w.norm1_b), d_norm_, in, P(w.norm1_w),
                               a.norm1_mean, a.norm1_rstd, n, c);
  }
}

void Transformer::Forward(const int32_t* inputs, int b, int t) {
  const int n = b * t;
  const int c = config_.d_model;
  backend_.EmbeddingForward(resid_[0], inputs, P(table_.token_embedding()),
                            P(table_.position_embedding()), b, t, c);
  for (int l = 0; l < config_.n_layer; ++l) {
    BlockForward(l, ActivationsFor(l), resid_[l], resid_[l + 1], b, t);
  }
  const float* last = resid_[config_.n_layer];
  if (config_.family == ModelFamily::kLlama) {
    backend_.RmsNormForward(final_norm_, final_rstd_, last, P(table_.final_norm_w()), n, c,
                            config_.norm_eps);
  } else {
    backend_.LayerNormForward(final_norm_, final_mean_, final_rstd_, last,
                              P(table_.final_norm_w()), P(table_.final_norm_b()), n, c,
                              config_.norm_eps);
  }
}

double Transformer::ForwardBackward(const int32_t* inputs, const int32_t* targets, int b, int t,
                                    float grad_scale) {
  Forward(inputs, b, t);
  const int n = b * t;
  const int c = config_.d_model;
  // The classifier's backward runs with its forward, so the (N, V) logits never exist whole.
  const double loss_sum =
      backend_.ClassifierForwardBackward(d_norm_, G(table_.head()), final_norm_,
                                         P(table_.head()), targets, n, c, config_.vocab_size,
                                         grad_scale);
  backend_.Zero(d_resid_, static_cast<size_t>(n) * c);
  const float* last = resid_[config_.n_layer];
  if (config_.family == ModelFamily::kLlama) {
    backend_.RmsNormBackward(d_resid_, G(table_.final_norm_w()), d_norm_, last,
                             P(table_.final_norm_w()), final_rstd_, n, c);
  } else {
    backend_.LayerNormBackward(d_resid_, G(table_.final_norm_w()), G(table_.final_norm_b()),
                               d_norm_, last, P(table_.final_norm_w()), final_mean_,
                               final_rstd_, n, c);
  }
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    BlockActivations& a = ActivationsFor(l);
    if (checkpointing_) BlockForward(l, a, resid_[l], nullptr, b, t);
    BlockBackward(l, a, resid_[l], d_resid_, b, t);
  }
  backend_.EmbeddingBackward(G(table_.token_embedding()), G(table_.position_embedding()),
                             d_resid_, inputs, b, t, c);
  return loss_sum;
}

double Transformer::ForwardLoss(const int32_t* inputs, const int32_t* targets, int b, int t) {
  Forward(inputs, b, t);
  return backend_.ClassifierForwardBackward(nullptr, nullptr, final_norm_, P(table_.head()),
                                            targets, b * t, config_.d_model,
                                            config_.vocab_size, 0.0f);
}

void Transformer::ForwardLogits(const int32_t* inputs, int b, int t, bool last_only,
                                float* logits) {
  Forward(inputs, b, t);
  const int c = config_.d_model;
  const int v = config_.vocab_size;
  if (!last_only) {
    backend_.LinearForward(logits, final_norm_, P(table_.head()), nullptr, b * t, c, v);
    return;
  }
  for (int i = 0; i < b; ++i) {
    const float* row = final_norm_ + (static_cast<size_t>(i) * t + t - 1) * c;
    backend_.LinearForward(logits + static_cast<size_t>(i) * v, row, P(table_.head()), nullptr,
                           1, c, v);
  }
}

}  // namespace dtrain
