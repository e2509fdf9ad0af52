// Hugging Face checkpoints <-> dtrain's parameter buffer. One table (HfTensorsFor) maps each
// internal tensor to the Hugging Face tensors that hold it; export and import both walk it.
//
// GPT-2 (transformers GPT2Model names, written without prefix; "transformer." prefixed names and
// the tied "lm_head.weight" of GPT2LMHeadModel are accepted on import): Conv1D weights are
// stored (in, out), the transpose of dtrain's (out, in). Llama (LlamaForCausalLM): dtrain's fused
// qkv rows split into q_proj, k_proj, v_proj and the fused mlp.up rows into gate_proj, up_proj;
// both use the rotate_half RoPE convention, so no head permutation is needed.
//
// Only the whole model (no pipeline or tensor-parallel slice) maps to a checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/io/safetensors.h"
#include "core/model/model_config.h"
#include "core/model/param_table.h"

namespace dtrain {

// A Hugging Face tensor holding rows [row_begin, row_begin + num_rows) of an internal tensor of
// shape (rows, cols) (a vector (n) counts as (n, 1)). Its shape is (num_rows, cols), or
// (cols, num_rows) when transposed.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t row_begin = 0;
  int64_t num_rows = 0;
  bool transposed = false;
};

// The Hugging Face tensors of one internal tensor, in row order. Errors (InvalidArgument) for a
// name the family does not have or a shape other than the whole model's.
absl::StatusOr<std::vector<HfTensor>> HfTensorsFor(const ModelConfig& config,
                                                   const TensorEntry& entry);

// The metadata key every export's weights carry (dtrain's version): what marks a model folder as
// an earlier export, which another may replace.
inline constexpr char kExportMarkerKey[] = "dtrain_version";

// Whether an export may write its weights to `path`: absent, or a safetensors file (weights
// replaced by weights). Anything else, such as a recipe named by mistake, is FailedPrecondition
// asking for kExitUsage.
absl::Status CheckReplaceableWeightsFile(const std::string& path);

// Writes every tensor of `table` from `params` (table.total_numel() floats) as F32 with Hugging
// Face names and layouts to `path` (atomically, see SafetensorsWriter), one tensor in host memory
// at a time, after CheckReplaceableWeightsFile. `metadata` is added to {"format": "pt"}, which
// transformers requires, and kExportMarkerKey.
absl::Status ExportHfSafetensors(const ModelConfig& config, const ParamTable& table,
                                 const float* params, const std::string& path,
                                 const SafetensorsMetadata& metadata = {});

// The same, with each internal tensor's values (entry.numel floats) from `read_tensor`, called
// once per tensor in table order; the pointer it returns must stay valid until the next call.
// `dtrain ckpt export` streams a checkpoint through it with one tensor in memory.
using TensorValuesFn = std::function<absl::StatusOr<const float*>(const TensorEntry& entry)>;
absl::Status ExportHfSafetensorsStreamed(const ModelConfig& config, const ParamTable& table,
                                         const TensorValuesFn& read_tensor, const std::string& path,
                                         const SafetensorsMetadata& metadata = {});

// Fills all of `params` (table.total_numel() floats) from a Hugging Face safetensors file (F32,
// F16 or BF16). Every expected tensor must be present with its shape; any other tensor is an
// error too, except known non-parameter buffers (GPT-2 attn.bias / attn.masked_bias and the tied
// lm_head.weight, Llama rotary_emb.inv_freq). Errors name the file and the tensor; on error
// `params` may be partly written. A null `params` checks the headers and reads no tensor.
absl::Status ImportHfSafetensors(const ModelConfig& config, const ParamTable& table,
                                 const std::string& path, float* params);

// Receives an imported tensor: its entry of the table and its entry.numel values, valid during
// the call.
using TensorSinkFn = std::function<absl::Status(const TensorEntry& entry, const float* values)>;

// The sink that copies each tensor into `params` at its entry's offset; null when `params` is.
TensorSinkFn CopyIntoParams(float* params);

// The same over the files of a sharded checkpoint (model-0000i-of-0000N.safetensors), each tensor
// in one of them; `where` (the folder) names them all in errors. Each tensor of `table` goes to
// `write_tensor` once, in table order, with one tensor in host memory at a time (a rank keeps
// only its slice of a model larger than its memory); a null sink checks the headers only.
// `head_from_embedding`: a Llama saved with tie_word_embeddings (Llama 3.2 1B, SmolLM) has no
// lm_head.weight; dtrain's own head then starts as a copy of model.embed_tokens.weight.
absl::Status ImportHfSafetensors(const ModelConfig& config, const ParamTable& table,
                                 const std::vector<std::string>& paths, const std::string& where,
                                 const TensorSinkFn& write_tensor,
                                 bool head_from_embedding = false);

}  // namespace dtrain
