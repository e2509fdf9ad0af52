// A decoder-only transformer (GPT-2 or Llama family) with hand-written forward and backward,
// one function pair per layer. Parameters and gradients are flat buffers laid out by the
// ParamTable; activations live in one arena sized for the largest micro-batch.
//
// Not thread-safe: one step at a time. The kernels it calls may use the backend's threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/backend/backend.h"
#include "core/model/model_config.h"
#include "core/model/param_table.h"

namespace dtrain {

class Transformer {
 public:
  // Sizes the activation arena for micro-batches of up to max_batch x max_time tokens. With
  // activation_checkpointing, only each block's input is kept and backward re-runs the block.
  Transformer(const ModelConfig& config, Backend& backend, int max_batch, int max_time,
              bool activation_checkpointing);

  const ModelConfig& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }
  std::span<float> grads() { return grads_; }
  std::span<const float> grads() const { return grads_; }
  size_t activation_bytes() const { return acts_.size() * sizeof(float); }

  // GPT-2 style: normal(0, init_std), residual projections scaled by 1/sqrt(2 n_layer), norm
  // weights 1, biases 0. Each tensor draws from its own stream of (seed, tensor name), so a
  // tensor's values do not depend on which other tensors a rank holds.
  void InitWeights(uint64_t seed);

  // One micro-batch: inputs and targets (b, t). Adds grad_scale * d(sum of token losses) to the
  // gradients and returns the sum of token losses (targets < 0 are ignored).
  double ForwardBackward(const int32_t* inputs, const int32_t* targets, int b, int t,
                         float grad_scale);
  // Sum of token losses, no gradients.
  double ForwardLoss(const int32_t* inputs, const int32_t* targets, int b, int t);
  // Logits (b, t, V), or only the last position's (b, V) when last_only.
  void ForwardLogits(const int32_t* inputs, int b, int t, bool last_only, float* logits);

 private:
  // Saved activations of one block, pointers into the arena. (N = b*t tokens.)
  struct BlockActivations {
    float* norm1;       // (N, C)
    float* norm1_mean;  // (N) LayerNorm only
    float* norm1_rstd;  // (N)
    float* qkv;         // (N, qkv_width), after RoPE
    float* attn;        // (N, H*D) attention output before the projection
    float* lse;         // (B, H, T)
    float* resid_mid;   // (N, C) block input + attention branch
    float* norm2;       // (N, C)
    float* norm2_mean;  // (N)
    float* norm2_rstd;  // (N)
    float* mlp_up;      // (N, F) gpt2, (N, 2F) llama: before the activation
    float* mlp_act;     // (N, F)
  };

  void AllocateActivations(int max_batch, int max_time);
  AttentionShape Shape(int b, int t) const;
  // Block `layer` from resid_[layer] into resid_[layer + 1] (the output is skipped when
  // `out` is null: recomputation only needs the saved activations).
  void BlockForward(int layer, BlockActivations& a, const float* in, float* out, int b, int t);
  // dresid holds d(block output) on entry and d(block input) on return.
  void BlockBackward(int layer, BlockActivations& a, const float* in, float* dresid, int b,
                     int t);
  // Embedding and all blocks; leaves the final norm's output in final_norm_.
  void Forward(const int32_t* inputs, int b, int t);
  BlockActivations& ActivationsFor(int layer);
  const float* P(size_t offset) const;
  float* G(size_t offset);

  ModelConfig config_;
  Backend& backend_;
  ParamTable table_;
  bool checkpointing_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<float> acts_;                  // the arena
  std::vector<float*> resid_;                // n_layer + 1 block inputs / outputs, (N, C) each
  std::vector<BlockActivations> blocks_;     // one per layer, or one shared when checkpointing
  float* final_norm_ = nullptr;              // (N, C)
  float* final_mean_ = nullptr;              // (N)
  float* final_rstd_ = nullptr;              // (N)
  // Backward scratch.
  float* d_resid_ = nullptr;    // (N, C)
  float* d_norm_ = nullptr;     // (N, C)
  float* d_qkv_ = nullptr;      // (N, qkv_width)
  float* d_attn_ = nullptr;     // (N, H*D)
  float* d_mlp_up_ = nullptr;   // (N, F or 2F)
  float* d_mlp_act_ = nullptr;  // (N, F)
  float* branch_out_ = nullptr; // (N, C) attention or MLP branch output before the residual add
  int max_tokens_ = 0;
};

}  // namespace dtrain
