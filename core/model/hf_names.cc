#include "core/model/hf_names.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/exit_codes.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// How one internal tensor maps: its whole-model shape and the Hugging Face tensors (name suffix,
// rows of ours they hold) that hold it, in row order.
struct Rule {
  std::string internal;  // without "blocks.{i}." for block tensors
  std::vector<int64_t> shape;
  std::vector<std::pair<std::string, int64_t>> pieces;
  bool transposed = false;
};

// The one mapping table, per family: global tensors, then tensors of block i.
std::vector<Rule> GlobalRules(const ModelConfig& c) {
  const int64_t d = c.d_model, v = c.vocab_size;
  if (c.family == ModelFamily::kGpt2) {
    return {{"embed.tokens", {v, d}, {{"wte.weight", v}}},
            {"embed.positions", {c.max_seq_len, d}, {{"wpe.weight", c.max_seq_len}}},
            {"final_norm.weight", {d}, {{"ln_f.weight", d}}},
            {"final_norm.bias", {d}, {{"ln_f.bias", d}}}};
  }
  return {{"embed.tokens", {v, d}, {{"model.embed_tokens.weight", v}}},
          {"final_norm.weight", {d}, {{"model.norm.weight", d}}},
          {"head.weight", {v, d}, {{"lm_head.weight", v}}}};
}

std::vector<Rule> BlockRules(const ModelConfig& c) {
  const int64_t d = c.d_model, f = c.d_ff;
  const int64_t q = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t kv = static_cast<int64_t>(c.n_kv_head) * c.head_dim;
  if (c.family == ModelFamily::kGpt2) {
    // GPT-2's c_attn output is q, k, v, each with heads consecutive: dtrain's qkv row order.
    return {{"norm1.weight", {d}, {{"ln_1.weight", d}}},
            {"norm1.bias", {d}, {{"ln_1.bias", d}}},
            {"attn.qkv.weight", {q + 2 * kv, d}, {{"attn.c_attn.weight", q + 2 * kv}}, true},
            {"attn.qkv.bias", {q + 2 * kv}, {{"attn.c_attn.bias", q + 2 * kv}}},
            {"attn.out.weight", {d, q}, {{"attn.c_proj.weight", d}}, true},
            {"attn.out.bias", {d}, {{"attn.c_proj.bias", d}}},
            {"norm2.weight", {d}, {{"ln_2.weight", d}}},
            {"norm2.bias", {d}, {{"ln_2.bias", d}}},
            {"mlp.up.weight", {f, d}, {{"mlp.c_fc.weight", f}}, true},
            {"mlp.up.bias", {f}, {{"mlp.c_fc.bias", f}}},
            {"mlp.down.weight", {d, f}, {{"mlp.c_proj.weight", d}}, true},
            {"mlp.down.bias", {d}, {{"mlp.c_proj.bias", d}}}};
  }
  return {{"norm1.weight", {d}, {{"input_layernorm.weight", d}}},
          {"attn.qkv.weight",
           {q + 2 * kv, d},
           {{"self_attn.q_proj.weight", q},
            {"self_attn.k_proj.weight", kv},
            {"self_attn.v_proj.weight", kv}}},
          {"attn.out.weight", {d, q}, {{"self_attn.o_proj.weight", d}}},
          {"norm2.weight", {d}, {{"post_attention_layernorm.weight", d}}},
          {"mlp.up.weight", {2 * f, d}, {{"mlp.gate_proj.weight", f}, {"mlp.up_proj.weight", f}}},
          {"mlp.down.weight", {d, f}, {{"mlp.down_proj.weight", d}}}};
}

int64_t Cols(const std::vector<int64_t>& shape) { return shape.size() == 2 ? shape[1] : 1; }

// Non-parameter tensors that Hugging Face checkpoints may carry; import skips them. Names are
// after stripping GPT-2's "transformer." prefix.
bool IsKnownBuffer(ModelFamily family, const std::string& name) {
  if (family == ModelFamily::kGpt2) {
    return name == "lm_head.weight" ||  // tied to wte.weight
           (absl::StartsWith(name, "h.") &&
            (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias")));
  }
  return absl::StartsWith(name, "model.layers.") &&
         absl::EndsWith(name, ".self_attn.rotary_emb.inv_freq");
}

// A tensor of the files being imported: its name there, and the file's reader and path.
struct StoredTensor {
  std::string name;
  const SafetensorsReader* reader = nullptr;
  const std::string* file = nullptr;
};

// A tied model's file may hold lm_head.weight as a copy of the embedding (GPT2LMHeadModel's
// state_dict). One that differs was trained untied: dtrain's GPT-2 cannot hold it, and a Llama
// whose config.json says tie_word_embeddings starts its head from the embedding. The import
// would drop it silently.
absl::Status CheckHeadIsTied(const ModelConfig& config,
                             const std::map<std::string, StoredTensor>& file_names,
                             bool head_from_embedding) {
  const bool gpt2 = config.family == ModelFamily::kGpt2;
  const auto head = file_names.find("lm_head.weight");
  const auto embedding = file_names.find(gpt2 ? "wte.weight" : "model.embed_tokens.weight");
  if (!(gpt2 || head_from_embedding) || head == file_names.end() || embedding == file_names.end()) {
    return absl::OkStatus();
  }
  const SafetensorsEntry* head_entry = head->second.reader->Find(head->second.name);
  const SafetensorsEntry* embedding_entry = embedding->second.reader->Find(embedding->second.name);
  bool tied = head_entry->spec.shape == embedding_entry->spec.shape;
  // A slice at a time: a tied Llama 3.2's embedding is 1 GB or more in float32.
  constexpr size_t kSlice = size_t{1} << 20;
  const size_t numel = static_cast<size_t>(NumElements(head_entry->spec.shape));
  std::vector<float> head_values(tied ? std::min(kSlice, numel) : 0);
  std::vector<float> embedding_values(head_values.size());
  for (size_t begin = 0; tied && begin < numel; begin += kSlice) {
    const size_t count = std::min(kSlice, numel - begin);
    RETURN_IF_ERROR(
        head->second.reader->ReadFloat32Slice(head->second.name, begin, count, head_values.data()));
    RETURN_IF_ERROR(embedding->second.reader->ReadFloat32Slice(embedding->second.name, begin, count,
                                                               embedding_values.data()));
    tied = std::equal(head_values.begin(), head_values.begin() + count, embedding_values.begin());
  }
  if (tied) return absl::OkStatus();
  const std::string differs = absl::StrCat(*head->second.file, ": ", head->second.name,
                                           " differs from ", embedding->second.name);
  const std::string fix =
      gpt2 ? ": dtrain's GPT-2 ties its output head to the token embedding, and this model was "
             "trained with an untied head; start from a tied GPT-2, or train a Llama (untied)"
           : ", but config.json says \"tie_word_embeddings\": true (transformers would load one "
             "over the other): set it to false to start from the saved head, or delete "
             "lm_head.weight to start the head from the embedding";
  return WithExitCode(absl::InvalidArgumentError(differs + fix), kExitUsage);
}

std::string ListSome(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(kShown, names.size()));
  std::string list = absl::StrJoin(shown, ", ");
  if (names.size() > kShown) absl::StrAppend(&list, " and ", names.size() - kShown, " more");
  return list;
}

absl::Status CheckWholeModel(const ModelConfig& config, const ParamTable& table) {
  if (table.HoldsWholeModel()) return absl::OkStatus();
  std::vector<std::string> spans;
  for (const BlockSpan& chunk : table.chunks()) {
    spans.push_back(absl::StrCat(chunk.first, "..", chunk.end() - 1));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "Hugging Face checkpoints map to the whole model; this parameter table holds blocks ",
      absl::StrJoin(spans, ", "), " of ", config.n_layer));
}

}  // namespace

absl::StatusOr<std::vector<HfTensor>> HfTensorsFor(const ModelConfig& config,
                                                   const TensorEntry& entry) {
  std::string rest = entry.name;
  std::string hf_prefix;
  std::vector<Rule> rules;
  if (absl::StartsWith(entry.name, "blocks.")) {
    const size_t dot = entry.name.find('.', 7);
    int block = -1;
    if (dot == std::string::npos || !absl::SimpleAtoi(entry.name.substr(7, dot - 7), &block) ||
        block < 0 || block >= config.n_layer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", entry.name, "' names no block of a ", config.n_layer, "-layer model"));
    }
    rest = entry.name.substr(dot + 1);
    hf_prefix = config.family == ModelFamily::kGpt2 ? absl::StrCat("h.", block, ".")
                                                    : absl::StrCat("model.layers.", block, ".");
    rules = BlockRules(config);
  } else {
    rules = GlobalRules(config);
  }
  const auto rule =
      std::find_if(rules.begin(), rules.end(), [&](const Rule& r) { return r.internal == rest; });
  if (rule == rules.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", entry.name, "' has no ", FamilyName(config.family), " Hugging Face name"));
  }
  if (entry.shape != rule->shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", entry.name, "' has shape ", ShapeString(entry.shape),
        " but the whole model's is ", ShapeString(rule->shape),
        "; Hugging Face checkpoints map to the whole model, not a tensor-parallel slice"));
  }
  const int64_t cols = Cols(rule->shape);
  std::vector<HfTensor> tensors;
  int64_t row = 0;
  for (const auto& [suffix, rows] : rule->pieces) {
    HfTensor t{hf_prefix + suffix, {rows, cols}, row, rows, rule->transposed};
    if (rule->shape.size() == 1) {
      t.shape = {rows};
    } else if (rule->transposed) {
      t.shape = {cols, rows};
    }
    tensors.push_back(std::move(t));
    row += rows;
  }
  return tensors;
}

absl::Status CheckReplaceableWeightsFile(const std::string& path) {
  // Only a regular file is opened (a FIFO's open would wait for a writer); what else lies there
  // is the writer's to refuse (ResolveOutputFile).
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error) || SafetensorsReader::Open(path).ok()) {
    return absl::OkStatus();
  }
  return WithExitCode(absl::FailedPreconditionError(absl::StrCat(
                          path,
                          " exists and is no safetensors file, which the export would write "
                          "over: give the weights a path of their own")),
                      kExitUsage);
}

absl::Status ExportHfSafetensors(const ModelConfig& config, const ParamTable& table,
                                 const float* params, const std::string& path,
                                 const SafetensorsMetadata& metadata) {
  return ExportHfSafetensorsStreamed(
      config, table,
      [params](const TensorEntry& entry) -> absl::StatusOr<const float*> {
        return params + entry.offset;
      },
      path, metadata);
}

absl::Status ExportHfSafetensorsStreamed(const ModelConfig& config, const ParamTable& table,
                                         const TensorValuesFn& read_tensor, const std::string& path,
                                         const SafetensorsMetadata& metadata) {
  RETURN_IF_ERROR(CheckWholeModel(config, table));
  RETURN_IF_ERROR(CheckReplaceableWeightsFile(path));
  std::vector<std::pair<const TensorEntry*, HfTensor>> pieces;
  std::vector<TensorSpec> specs;
  for (const TensorEntry& entry : table.entries()) {
    ASSIGN_OR_RETURN(std::vector<HfTensor> tensors, HfTensorsFor(config, entry));
    for (HfTensor& t : tensors) {
      specs.push_back({t.name, DType::kF32, t.shape});
      pieces.emplace_back(&entry, std::move(t));
    }
  }
  SafetensorsMetadata all_metadata = metadata;
  all_metadata["format"] = "pt";
  all_metadata[kExportMarkerKey] = DTRAIN_VERSION;
  // Its folder, as a model folder's export creates its own.
  if (const std::filesystem::path parent = std::filesystem::path(path).parent_path();
      !parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the folder of ", path, ": ", error.message()));
    }
  }
  ASSIGN_OR_RETURN(SafetensorsWriter writer,
                   SafetensorsWriter::Create(path, std::move(specs), all_metadata));
  std::vector<float> transposed;
  const TensorEntry* current = nullptr;
  const float* values = nullptr;  // of `current`
  for (const auto& [entry, t] : pieces) {
    if (entry != current) {
      ASSIGN_OR_RETURN(values, read_tensor(*entry));
      current = entry;
    }
    const int64_t cols = Cols(entry->shape);
    const float* rows = values + t.row_begin * cols;  // (num_rows, cols)
    if (!t.transposed) {
      RETURN_IF_ERROR(writer.WriteTensor(t.name, rows));
      continue;
    }
    transposed.resize(static_cast<size_t>(t.num_rows * cols));  // (cols, num_rows)
    for (int64_t r = 0; r < t.num_rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) transposed[c * t.num_rows + r] = rows[r * cols + c];
    }
    RETURN_IF_ERROR(writer.WriteTensor(t.name, transposed.data()));
  }
  return writer.Finish();
}

TensorSinkFn CopyIntoParams(float* params) {
  if (params == nullptr) return nullptr;
  return [params](const TensorEntry& entry, const float* values) {
    std::copy_n(values, entry.numel, params + entry.offset);
    return absl::OkStatus();
  };
}

absl::Status ImportHfSafetensors(const ModelConfig& config, const ParamTable& table,
                                 const std::string& path, float* params) {
  return ImportHfSafetensors(config, table, std::vector<std::string>{path}, path,
                             CopyIntoParams(params));
}

absl::Status ImportHfSafetensors(const ModelConfig& config, const ParamTable& table,
                                 const std::vector<std::string>& paths, const std::string& where,
                                 const TensorSinkFn& write_tensor, bool head_from_embedding) {
  RETURN_IF_ERROR(CheckWholeModel(config, table));
  std::vector<SafetensorsReader> readers;
  for (const std::string& file : paths) {
    ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(file));
    readers.push_back(std::move(reader));
  }

  // Canonical (unprefixed) name -> name in its file, and that file's reader.
  std::map<std::string, StoredTensor> file_names;
  for (size_t i = 0; i < readers.size(); ++i) {
    for (const SafetensorsEntry& e : readers[i].tensors()) {
      std::string name = e.spec.name;
      if (config.family == ModelFamily::kGpt2 && absl::StartsWith(name, "transformer.")) {
        name = name.substr(12);
      }
      if (!file_names.emplace(name, StoredTensor{e.spec.name, &readers[i], &paths[i]}).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(paths[i], ": tensor '", name,
                         "' appears twice (with and without the 'transformer.' prefix, or in two "
                         "files of ",
                         where, ")"));
      }
    }
  }

  // Check everything before reading, so a wrong file fails fast and leaves params untouched.
  std::vector<std::tuple<const TensorEntry*, HfTensor, const SafetensorsReader*>> pieces;
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (const TensorEntry& entry : table.entries()) {
    ASSIGN_OR_RETURN(std::vector<HfTensor> tensors, HfTensorsFor(config, entry));
    for (HfTensor& t : tensors) {
      auto it = file_names.find(t.name);
      if (head_from_embedding && config.family == ModelFamily::kLlama &&
          t.name == "lm_head.weight") {
        // Tied, the head is the embedding, as transformers builds it: an lm_head.weight the
        // files also hold must equal it (CheckHeadIsTied).
        if (it != file_names.end()) used.insert(it->first);
        it = file_names.find("model.embed_tokens.weight");
      }
      if (it == file_names.end()) {
        missing.push_back(t.name);
        continue;
      }
      used.insert(it->first);
      const StoredTensor& stored = it->second;
      const std::vector<int64_t>& found = stored.reader->Find(stored.name)->spec.shape;
      if (found != t.shape) {
        // A folder's config.json has been checked against the recipe: its weights disagree with
        // it.
        const bool in_folder = *stored.file != where;
        return absl::InvalidArgumentError(absl::StrCat(
            *stored.file, ": tensor '", stored.name, "' has shape ", ShapeString(found),
            ", expected ", ShapeString(t.shape), " (for dtrain's '", entry.name, "'); ",
            in_folder ? absl::StrCat("the folder's config.json, which the recipe matches, does not "
                                     "describe its weights: save the folder again (",
                                     where, ")")
                      : "make model.* in the recipe match the checkpoint"));
      }
      t.name = stored.name;
      pieces.emplace_back(&entry, std::move(t), stored.reader);
    }
  }
  if (missing == std::vector<std::string>{"lm_head.weight"}) {
    // A Llama saved with tie_word_embeddings (Llama 3.2 1B, SmolLM) has no head of its own.
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": no lm_head.weight, as a Llama saved with tie_word_embeddings has none: give its "
        "Hugging Face folder, whose config.json says \"tie_word_embeddings\": true, and the head "
        "starts as a copy of model.embed_tokens.weight"));
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": missing ", missing.size(), " tensor(s) of the ",
                     FamilyName(config.family), " model: ", ListSome(missing),
                     "; is model.family / model.n_layer right for this checkpoint?"));
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, stored] : file_names) {
    if (!used.contains(name) && !IsKnownBuffer(config.family, name)) {
      unexpected.push_back(stored.name);
    }
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", unexpected.size(), " unexpected tensor(s) for a ", config.n_layer,
                     "-layer ", FamilyName(config.family), " model: ", ListSome(unexpected),
                     "; is model.family / model.n_layer right for this checkpoint?"));
  }

  if (!write_tensor) return absl::OkStatus();
  RETURN_IF_ERROR(CheckHeadIsTied(config, file_names, head_from_embedding));
  // A tensor's pieces (the files' tensors it is made of) are adjacent, in table order.
  std::vector<float> values, transposed;
  // A NaN or infinity would surface as a NaN loss at the first step, blamed on the learning rate.
  const auto check_finite = [&](const std::string& name, const float* read, int64_t count) {
    const float* end = read + count;
    const float* bad = std::find_if(read, end, [](float v) { return !std::isfinite(v); });
    if (bad == end) return absl::OkStatus();
    // A restart would read them again: the usage error's exit code, which launch does not
    // restart.
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            where, ": tensor '", name, "' holds ", *bad, " at element ", bad - read, " of ", count,
            ": the weights are damaged, or were saved from a run that diverged; give weights "
            "saved before it")),
        kExitUsage);
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto& [entry, t, reader] = pieces[i];
    values.resize(entry->numel);
    const int64_t cols = Cols(entry->shape);
    float* rows = values.data() + t.row_begin * cols;  // (num_rows, cols)
    if (!t.transposed) {
      RETURN_IF_ERROR(reader->ReadFloat32(t.name, rows));
      RETURN_IF_ERROR(check_finite(t.name, rows, t.num_rows * cols));
    } else {
      transposed.resize(static_cast<size_t>(t.num_rows * cols));  // (cols, num_rows)
      RETURN_IF_ERROR(reader->ReadFloat32(t.name, transposed.data()));
      RETURN_IF_ERROR(check_finite(t.name, transposed.data(), t.num_rows * cols));
      for (int64_t r = 0; r < t.num_rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) rows[r * cols + c] = transposed[c * t.num_rows + r];
      }
    }
    if (i + 1 == pieces.size() || std::get<0>(pieces[i + 1]) != entry) {
      RETURN_IF_ERROR(write_tensor(*entry, values.data()));
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain
