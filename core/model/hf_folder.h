// Hugging Face model folders, as transformers' save_pretrained writes them and from_pretrained
// reads them: config.json (GPT2Config / LlamaConfig), the weights (model.safetensors, or shards
// listed by model.safetensors.index.json) and the tokenizer files.
//
// Export writes tokenizer files first, then the weights, then config.json last, so a folder with
// config.json is complete. Import checks config.json against dtrain's model before reading any
// weight, naming every field that disagrees with both values and the recipe key to change.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/data/chat_template.h"
#include "core/data/tokenizer.h"
#include "core/io/safetensors.h"
#include "core/model/hf_names.h"
#include "core/model/model_config.h"
#include "core/model/param_table.h"

namespace dtrain {

// Token ids of the tokenizer's begin/end-of-text markers, for config.json; unset when the
// tokenizer names none that transformers would use.
struct HfSpecialTokens {
  std::optional<int> bos_id;
  std::optional<int> eos_id;
};

// config.json's text for `config` (float32 weights).
std::string HfConfigJson(const ModelConfig& config, const HfSpecialTokens& tokens = {});

// OK when the config.json at `path` describes `config`'s model; otherwise InvalidArgument listing
// each disagreeing field, e.g. "model.n_layer is 4 but num_hidden_layers is 2 (set model.n_layer:
// 2)". Fields dtrain does not implement (rope_scaling, untied GPT-2 heads, other activations,
// biases on Llama) are errors that name them.
absl::Status CheckHfConfig(const ModelConfig& config, const std::string& path);

// A recipe's model key as a Hugging Face config.json gives it.
struct HfModelKey {
  std::string recipe_key;  // "model.n_layer"
  std::string value;       // as recipe text: "12"
  std::string hf_key;      // "n_layer"
};

// The recipe's model keys that the config.json at `path` gives, model.family first, with
// transformers' defaults for absent fields: what train.init_from's folder sets where a recipe
// leaves them unset, as from_pretrained takes a model's shape from its folder. Llama's
// max_position_embeddings gives model.max_seq_len. InvalidArgument for a model_type dtrain does not
// run; a field that is not a number is left out (CheckHfConfig names it at start).
absl::StatusOr<std::vector<HfModelKey>> HfModelKeys(const std::string& path);

// The model that an export of a run started from `init_from` describes (its config.json, its
// tokenizer's model_max_length): `config`, but a Llama keeps the context of the folder it started
// from, that folder's max_position_embeddings, where longer than model.max_seq_len. Llama has no
// position tensor: training on shorter sequences does not shorten its context. `config` where
// `init_from` is no such folder (a weights file, a GPT-2), with a warning where no folder or file
// is there.
ModelConfig ExportedModelConfig(const ModelConfig& config, const std::string& init_from);

// Copies the tokenizer at `tokenizer_path` into `dir` under the names AutoTokenizer looks for:
// a tokenizer.json (fast tokenizer), a SentencePiece tokenizer.model (LlamaTokenizer), or GPT-2's
// encoder.json + vocab.bpe (GPT2Tokenizer's vocab.json + merges.txt); `tokenizer_path` is such a
// file or a folder holding one. A tokenizer_config.json and special_tokens_map.json beside it are
// copied too, else written; with a tokenizer_config.json, so are the folder's other tokenizer
// files, which it may load. `max_seq_len` becomes model_max_length.
// Why AutoTokenizer's default (fast) tokenizer on a folder that the tokenizer at
// `tokenizer_path` (loaded: `tokenizer`) is exported into would encode otherwise than it does;
// empty when it would not. A SentencePiece model that comes without a tokenizer.json and
// normalizes text (NFKC, runs of spaces collapsed: sentencepiece's default nmt_nfkc, unlike
// Llama's identity) or adds no dummy prefix: transformers builds the fast tokenizer from
// tokenizer.model with Llama's rules, ignoring both (the slow LlamaTokenizer, use_fast=False,
// runs the model itself).
absl::StatusOr<std::string> FastTokenizerCaveat(const Tokenizer& tokenizer,
                                                const std::string& tokenizer_path);

absl::StatusOr<HfSpecialTokens> CopyHfTokenizer(const std::string& tokenizer_path,
                                                const std::string& dir, int max_seq_len);

// One token per byte (ByteTokenizer, data.format text's) as files AutoTokenizer loads into `dir`:
// a byte-level tokenizer.json whose 256 tokens' ids are their bytes, without merges, a
// tokenizer_config.json (PreTrainedTokenizerFast, `max_seq_len` its model_max_length) and an
// empty special_tokens_map.json.
absl::Status WriteByteTokenizer(const std::string& dir, int max_seq_len);

// Whether a file named `name` in a model folder is one that ExportHfFolder writes or, left by an
// earlier export, removes: config.json, the weights and their index or shards, the tokenizer's.
bool IsHfFolderFile(absl::string_view name);

// Whether the folder `dir` holds an export of dtrain's: its model.safetensors, a regular file (not
// a link), carries kExportMarkerKey, or `dtrain ckpt export`'s dtrain_checkpoint.
bool HoldsDtrainExport(const std::string& dir);

// Whether ExportHfFolder may write into `dir`: absent, holding none of the files it writes or
// removes (IsHfFolderFile), or an earlier export (HoldsDtrainExport). Another model's folder, a
// downloaded one say, is FailedPrecondition asking for kExitUsage, naming the files the export
// would replace.
absl::Status CheckReplaceableModelFolder(const std::string& dir);

// Writes the folder `dir` (created if missing): model.safetensors from `read_tensor`
// (ExportHfSafetensorsStreamed) with `metadata`, the tokenizer when `tokenizer_path` is not
// empty (CopyHfTokenizer's path, or ByteTokenizer's name "bytes": WriteByteTokenizer), then
// config.json, after CheckReplaceableModelFolder. The model and tokenizer files of an
// earlier export there are removed first, config.json before them (the folder's other files stay).
// A tokenizer with more ids than the model's vocabulary is refused first; one whose fast conversion
// encodes otherwise (FastTokenizerCaveat) is exported with a warning that says so. With the
// tokenizer, `chat_template` (the one an SFT run trained on; null for none) becomes its
// tokenizer_config.json's chat_template (TemplateJinja, in place of one copied), and the special
// tokens its assistant suffix writes (<|eot_id|>) join the end-of-sequence ids of
// generation_config.json, at which generate() stops.
absl::Status ExportHfFolder(const ModelConfig& config, const ParamTable& table,
                            const TensorValuesFn& read_tensor, const std::string& dir,
                            const std::string& tokenizer_path,
                            const SafetensorsMetadata& metadata = {},
                            const ChatTemplate* chat_template = nullptr);

// Whether `path` is a Llama's Hugging Face folder whose config.json says tie_word_embeddings:
// dtrain's head then starts as a copy of the embedding and trains apart from it.
absl::StatusOr<bool> HfLlamaTiesHead(const ModelConfig& config, const std::string& path);

// Hands every tensor of `table` (the whole model's) to `write_tensor`, one at a time, from
// `path`: a safetensors file (ImportHfSafetensors), or a Hugging Face model folder whose
// config.json passes CheckHfConfig and whose weights are model.safetensors or the shards its
// model.safetensors.index.json lists. A Llama with tie_word_embeddings gets its head from the
// embedding (ImportHfSafetensors); dtrain trains the two apart and exports them untied.
absl::Status ImportHfWeights(const ModelConfig& config, const ParamTable& table,
                             const std::string& path, const TensorSinkFn& write_tensor);
// The same, filling all of `params` (table.total_numel() floats).
absl::Status ImportHfWeights(const ModelConfig& config, const ParamTable& table,
                             const std::string& path, float* params);

// What ImportHfWeights checks, reading only config.json and the safetensors headers: OK when the
// weights at `path` are the whole of `config`'s model, else the error the import would return.
absl::Status CheckHfWeights(const ModelConfig& config, const std::string& path);

}  // namespace dtrain
