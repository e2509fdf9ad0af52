// The resolved shape of a transformer and the part of it one rank holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/recipe/recipe.h"

namespace dtrain {

enum class ModelFamily {
  kGpt2,   // LayerNorm, learned positions, GELU, biases, output tied to the token embedding
  kLlama,  // RMSNorm, RoPE, SwiGLU, no biases, untied output head, grouped-query attention
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kGpt2;
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 0;  // d_model / n_head
  int d_model = 0;
  int d_ff = 0;  // MLP hidden width (per SwiGLU branch for llama)
  int vocab_size = 0;
  int max_seq_len = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  float init_std = 0.02f;

  bool has_biases() const { return family == ModelFamily::kGpt2; }
  bool has_position_embedding() const { return family == ModelFamily::kGpt2; }
  bool tied_head() const { return family == ModelFamily::kGpt2; }
  // Total parameter count of the whole model.
  int64_t num_parameters() const;
  // Training FLOPs per token: 6 * (non-embedding-lookup parameters) + attention 6*L*T*C
  // (forward 2*L*T*C for QK^T and PV over the causal half, times 3 for backward).
  double flops_per_token(int seq_len) const;
};

ModelConfig ModelConfigFromRecipe(const ModelSection& model, int d_ff);
const char* FamilyName(ModelFamily family);
// "gpt2, 4 layers, d_model 256, 4 heads (4 kv), vocab 256: 3.30M parameters" (from 1e9, "6.74B")
std::string ModelShapeLine(const ModelConfig& config);

// Transformer blocks [first, first + count).
struct BlockSpan {
  int first = 0;
  int count = 0;

  int end() const { return first + count; }
  friend bool operator==(const BlockSpan&, const BlockSpan&) = default;
};

// The part of the model one rank holds: its pipeline stage's model chunks, each a range of
// contiguous blocks, and a share of each block's heads and MLP width (tensor parallel). The
// ParamTable sizes the tensors from it and the layers compute with its LocalDims.
struct ModelSlice {
  // In model order: one chunk per stage, or under an interleaved schedule several, apart (the
  // stage's model chunks, schedule.h). Empty: every block, as one chunk.
  std::vector<BlockSpan> chunks;
  int tp_rank = 0;
  int tp_size = 1;
};

// The slice's chunks: `slice.chunks`, or the whole model's blocks as one.
std::vector<BlockSpan> ChunksOf(const ModelConfig& config, const ModelSlice& slice);

// OK when `tp` ranks can share the model Megatron-style: n_head and d_ff divide by tp, and the
// kv heads either split (n_kv_head % tp == 0) or are replicated (tp % n_kv_head == 0). The
// error names the recipe keys at fault.
absl::Status CheckTensorParallel(const ModelConfig& config, int tp);

}  // namespace dtrain
