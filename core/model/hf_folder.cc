#include "core/model/hf_folder.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/data/tokenizers/bpe.h"
#include "core/data/tokenizers/load_tokenizer.h"
#include "core/data/tokenizers/sentencepiece_library.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "nlohmann/json.hpp"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kWeightsName[] = "model.safetensors";
constexpr char kWeightsIndexName[] = "model.safetensors.index.json";

absl::StatusOr<Json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not valid JSON (cut short, or edited by hand?)"));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  return json;
}

Json TokenIdOrNull(const std::optional<int>& id) { return id ? Json(*id) : Json(nullptr); }

// A config.json field that a recipe's model key gives: absent or null, it reads as `missing`
// (transformers' default for it).
struct HfField {
  const char* hf_key;
  const char* recipe_key;
  double (*ours)(const ModelConfig&);
  double missing;
};

double NumberOr(const Json& json, const char* key, double missing) {
  const Json value = json.value(key, Json());
  return value.is_number() ? value.get<double>() : missing;
}

// The fields of config.json's model_type (gpt2, else llama) that a recipe's model keys must equal,
// which HfModelKeys fills them from. Llama's max_position_embeddings is not one: it bounds
// model.max_seq_len (HfModelKeys fills that from it too).
std::vector<HfField> HfFieldsOf(const Json& json) {
  if (json.value("model_type", Json()) == "gpt2") {
    return {
        {"n_layer", "model.n_layer", [](const ModelConfig& c) { return double(c.n_layer); }, 12},
        {"n_head", "model.n_head", [](const ModelConfig& c) { return double(c.n_head); }, 12},
        {"n_embd", "model.d_model", [](const ModelConfig& c) { return double(c.d_model); }, 768},
        {"n_inner", "model.d_ff", [](const ModelConfig& c) { return double(c.d_ff); },
         4 * NumberOr(json, "n_embd", 768)},
        {"vocab_size", "model.vocab_size",
         [](const ModelConfig& c) { return double(c.vocab_size); }, 50257},
        {"n_positions", "model.max_seq_len",
         [](const ModelConfig& c) { return double(c.max_seq_len); }, 1024},
        {"layer_norm_epsilon", "model.norm_eps",
         [](const ModelConfig& c) { return double(c.norm_eps); }, 1e-5}};
  }
  return {{"num_hidden_layers", "model.n_layer",
           [](const ModelConfig& c) { return double(c.n_layer); }, 32},
          {"num_attention_heads", "model.n_head",
           [](const ModelConfig& c) { return double(c.n_head); }, 32},
          {"num_key_value_heads", "model.n_kv_head",
           [](const ModelConfig& c) { return double(c.n_kv_head); },
           NumberOr(json, "num_attention_heads", 32)},
          {"hidden_size", "model.d_model", [](const ModelConfig& c) { return double(c.d_model); },
           4096},
          {"intermediate_size", "model.d_ff", [](const ModelConfig& c) { return double(c.d_ff); },
           11008},
          {"vocab_size", "model.vocab_size",
           [](const ModelConfig& c) { return double(c.vocab_size); }, 32000},
          {"rms_norm_eps", "model.norm_eps",
           [](const ModelConfig& c) { return double(c.norm_eps); }, 1e-6},
          {"rope_theta", "model.rope_theta",
           [](const ModelConfig& c) { return double(c.rope_theta); }, 10000}};
}

std::string Number(double value) { return absl::StrFormat("%g", value); }

absl::Status NotAFamilyDtrainRuns(const std::string& path, const Json& model_type) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": model_type ", model_type.dump(),
                                                 " is not a family dtrain runs (gpt2, llama)"));
}

// "model.n_layer is 4 but n_layer is 2 (set model.n_layer: 2)" for each disagreeing field.
void CompareFields(const Json& json, const ModelConfig& c, std::vector<std::string>& problems) {
  for (const HfField& field : HfFieldsOf(json)) {
    const auto it = json.find(field.hf_key);
    double theirs = field.missing;
    if (it != json.end() && !it->is_null()) {
      if (!it->is_number()) {
        problems.push_back(absl::StrCat(field.hf_key, " is ", it->dump(), ", not a number"));
        continue;
      }
      theirs = it->get<double>();
    }
    // Floats in config.json are decimal doubles; dtrain keeps norm_eps and rope_theta in float.
    const double ours = field.ours(c);
    if (std::abs(theirs - ours) <= 1e-6 * std::abs(theirs)) continue;
    problems.push_back(absl::StrCat(field.recipe_key, " is ", Number(ours), " but ", field.hf_key,
                                    " is ", Number(theirs), " (set ", field.recipe_key, ": ",
                                    Number(theirs), ")"));
  }
}

// A field whose value dtrain's model implements only as `expected` (absent reads as `missing`).
void RequireValue(const Json& json, const std::string& key, const Json& missing,
                  const std::vector<Json>& expected, const std::string& why,
                  std::vector<std::string>& problems) {
  const auto it = json.find(key);
  const Json& value = it == json.end() ? missing : *it;
  for (const Json& e : expected) {
    if (value == e) return;
  }
  problems.push_back(absl::StrCat(key, " is ", value.dump(), ": ", why));
}

// The tokenizer files of one kind and the config transformers needs beside them.
struct TokenizerKind {
  std::vector<std::pair<fs::path, std::string>> copies;  // source -> name in the folder
  std::string tokenizer_class;
};

absl::StatusOr<TokenizerKind> FindTokenizer(const fs::path& path) {
  std::error_code error;
  const auto pair_in = [](const fs::path& dir, const char* vocab,
                          const char* merges) -> std::optional<TokenizerKind> {
    std::error_code e;
    if (!fs::exists(dir / vocab, e) || !fs::exists(dir / merges, e)) return std::nullopt;
    return TokenizerKind{{{dir / vocab, "vocab.json"}, {dir / merges, "merges.txt"}},
                         "GPT2Tokenizer"};
  };
  if (fs::is_directory(path, error)) {
    if (fs::exists(path / "tokenizer.json", error)) {
      return TokenizerKind{{{path / "tokenizer.json", "tokenizer.json"}},
                           "PreTrainedTokenizerFast"};
    }
    if (fs::exists(path / "tokenizer.model", error)) {
      return TokenizerKind{{{path / "tokenizer.model", "tokenizer.model"}}, "LlamaTokenizer"};
    }
    if (auto kind = pair_in(path, "vocab.json", "merges.txt")) return *kind;
    if (auto kind = pair_in(path, "encoder.json", "vocab.bpe")) return *kind;
    return absl::NotFoundError(absl::StrCat(
        "tokenizer folder ", path.string(),
        " holds no tokenizer.json, tokenizer.model, vocab.json + merges.txt or encoder.json + "
        "vocab.bpe"));
  }
  if (!fs::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat("tokenizer ", path.string(), " does not exist"));
  }
  const std::string name = path.filename().string();
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  if (name == "encoder.json" || name == "vocab.bpe" || name == "vocab.json" ||
      name == "merges.txt") {
    const bool openai = name == "encoder.json" || name == "vocab.bpe";
    if (auto kind = openai ? pair_in(dir, "encoder.json", "vocab.bpe")
                           : pair_in(dir, "vocab.json", "merges.txt")) {
      return *kind;
    }
    return absl::NotFoundError(absl::StrCat("tokenizer ", path.string(), ": its pair (",
                                            openai ? "encoder.json + vocab.bpe"
                                                   : "vocab.json + "
                                                     "merges.txt",
                                            ") is not complete in ", dir.string()));
  }
  if (path.extension() == ".model") {
    return TokenizerKind{{{path, "tokenizer.model"}}, "LlamaTokenizer"};
  }
  if (path.extension() == ".json") {
    return TokenizerKind{{{path, "tokenizer.json"}}, "PreTrainedTokenizerFast"};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer ", path.string(),
      " is not a tokenizer.json, a SentencePiece .model, GPT-2's encoder.json / vocab.bpe or a "
      "folder holding one"));
}

// Special tokens by the names the common vocabularies give them, first match wins.
struct NamedToken {
  std::string content;
  int id = 0;
};
struct SpecialTokens {
  std::optional<NamedToken> bos, eos, unk;
};

std::optional<NamedToken> FirstOf(const std::map<std::string, int>& vocab,
                                  std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const auto it = vocab.find(name); it != vocab.end()) return NamedToken{name, it->second};
  }
  return std::nullopt;
}

SpecialTokens SpecialTokensOf(const std::map<std::string, int>& vocab) {
  return {FirstOf(vocab, {"<|begin_of_text|>", "<s>", "<|endoftext|>"}),
          FirstOf(vocab, {"<|end_of_text|>", "</s>", "<|endoftext|>"}),
          FirstOf(vocab, {"<unk>", "<|endoftext|>"})};
}

// The special tokens transformers would use: tokenizer.json's added tokens, GPT-2's vocabulary,
// a SentencePiece model's special pieces of LlamaTokenizer's names (<s>, </s>, <unk>).
absl::StatusOr<SpecialTokens> FindSpecialTokens(const TokenizerKind& kind) {
  const fs::path& file = kind.copies.front().first;
  std::map<std::string, int> vocab;
  if (kind.tokenizer_class == "LlamaTokenizer") {
    ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(file.string()));
    for (const char* name : {"<s>", "</s>", "<unk>"}) {
      if (const absl::StatusOr<int32_t> id = tokenizer->SpecialToken(name); id.ok()) {
        vocab[name] = *id;
      }
    }
    return SpecialTokensOf(vocab);
  }
  ASSIGN_OR_RETURN(const Json json, ReadJson(file.string()));
  if (kind.tokenizer_class == "GPT2Tokenizer") {
    for (const auto& [token, id] : json.items()) {
      if (id.is_number_integer()) vocab[token] = id.get<int>();
    }
    return SpecialTokensOf(vocab);
  }
  const auto added = json.find("added_tokens");
  if (added == json.end() || !added->is_array()) return SpecialTokens{};
  for (const Json& token : *added) {
    if (token.is_object() && token.value("content", Json()).is_string() &&
        token.value("id", Json()).is_number_integer()) {
      vocab[token["content"].get<std::string>()] = token["id"].get<int>();
    }
  }
  return SpecialTokensOf(vocab);
}

absl::Status CopyFile(const fs::path& from, const fs::path& to) {
  std::error_code error;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("copy ", from.string(), " to ", to.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HfConfigJson(const ModelConfig& c, const HfSpecialTokens& tokens) {
  Json json;
  // Decimal values as the recipe gave them, not the float dtrain rounds them to.
  const auto decimal = [](float value) { return std::stod(absl::StrFormat("%.7g", value)); };
  if (c.family == ModelFamily::kGpt2) {
    json = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.max_seq_len},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_inner", c.d_ff},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", decimal(c.norm_eps)},
            {"initializer_range", decimal(c.init_std)},
            // dtrain trains without dropout.
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true}};
  } else {
    json = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.max_seq_len},
            {"hidden_size", c.d_model},
            {"intermediate_size", c.d_ff},
            {"num_hidden_layers", c.n_layer},
            {"num_attention_heads", c.n_head},
            {"num_key_value_heads", c.n_kv_head},
            {"head_dim", c.head_dim},
            {"hidden_act", "silu"},
            {"rms_norm_eps", decimal(c.norm_eps)},
            {"rope_theta", decimal(c.rope_theta)},
            {"rope_scaling", nullptr},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"attention_dropout", 0.0},
            {"initializer_range", decimal(c.init_std)},
            {"tie_word_embeddings", false}};
  }
  json["bos_token_id"] = TokenIdOrNull(tokens.bos_id);
  json["eos_token_id"] = TokenIdOrNull(tokens.eos_id);
  json["torch_dtype"] = "float32";
  json["use_cache"] = true;
  return json.dump(2) + "\n";
}

absl::StatusOr<std::vector<HfModelKey>> HfModelKeys(const std::string& path) {
  ASSIGN_OR_RETURN(const Json json, ReadJson(path));
  const Json model_type = json.value("model_type", Json());
  if (model_type != "gpt2" && model_type != "llama") return NotAFamilyDtrainRuns(path, model_type);
  std::vector<HfModelKey> keys = {{"model.family", model_type.get<std::string>(), "model_type"}};
  std::vector<HfField> fields = HfFieldsOf(json);
  if (model_type == "llama") {
    fields.push_back({"max_position_embeddings", "model.max_seq_len", nullptr, 2048});
  }
  for (const HfField& field : fields) {
    const Json value = json.value(field.hf_key, Json());
    if (!value.is_null() && !value.is_number()) continue;
    const double number = value.is_number() ? value.get<double>() : field.missing;
    // Recipe text: integers as integers (an int key refuses "12.0"), others round-trip exact.
    const bool integral = number == std::floor(number) && std::abs(number) < 1e15;
    keys.push_back({field.recipe_key,
                    integral ? absl::StrCat(static_cast<int64_t>(number)) : Json(number).dump(),
                    field.hf_key});
  }
  return keys;
}

ModelConfig ExportedModelConfig(const ModelConfig& config, const std::string& init_from) {
  ModelConfig exported = config;
  std::error_code error;
  // A weights file has no context to keep.
  if (config.family != ModelFamily::kLlama || init_from.empty() ||
      absl::EndsWith(init_from, ".safetensors")) {
    return exported;
  }
  if (!fs::exists(init_from, error)) {
    LogWarn(
        "train.init_from %s, where the run started, is not here%s: config.json's "
        "max_position_embeddings is model.max_seq_len, %d, which may be shorter than the context "
        "the model started with (set it in config.json where so)",
        init_from,
        fs::path(init_from).is_relative()
            ? absl::StrCat(" (looked for under ", fs::current_path(error).string(), ")")
            : "",
        config.max_seq_len);
    return exported;
  }
  if (!fs::is_directory(init_from, error)) return exported;
  const absl::StatusOr<Json> json = ReadJson((fs::path(init_from) / "config.json").string());
  if (!json.ok()) return exported;
  const Json positions = json->value("max_position_embeddings", Json());
  if (positions.is_number_integer() && positions.get<int64_t>() > config.max_seq_len &&
      positions.get<int64_t>() <= std::numeric_limits<int>::max()) {
    exported.max_seq_len = positions.get<int>();
  }
  return exported;
}

absl::Status CheckHfConfig(const ModelConfig& c, const std::string& path) {
  ASSIGN_OR_RETURN(const Json json, ReadJson(path));
  const Json model_type = json.value("model_type", Json());
  const std::string family = FamilyName(c.family);
  if (model_type != "gpt2" && model_type != "llama") return NotAFamilyDtrainRuns(path, model_type);
  // Another family's folder: its fields would be compared with keys the recipe never set (it
  // fills none from a folder of another family), so the family alone is the fix.
  if (model_type != family) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " does not match the recipe's model: model.family is ", family, " but model_type is ",
        model_type.dump(), " (set model.family: ", model_type.get<std::string>(),
        ", or leave it unset: the folder then gives every model key the recipe leaves unset)"));
  }
  // The recipe's model against the folder's, every field at once.
  std::vector<std::string> problems;
  if (model_type == "gpt2") {
    CompareFields(json, c, problems);
    RequireValue(json, "activation_function", "gelu_new", {"gelu_new", "gelu_pytorch_tanh"},
                 "dtrain's GPT-2 uses GELU's tanh approximation (gelu_new)", problems);
    RequireValue(json, "tie_word_embeddings", true, {true},
                 "dtrain's GPT-2 ties its output head to the token embedding", problems);
    RequireValue(json, "scale_attn_weights", true, {true},
                 "dtrain scales attention scores by 1/sqrt(head_dim)", problems);
    RequireValue(json, "scale_attn_by_inverse_layer_idx", false, {false},
                 "dtrain scales attention scores by 1/sqrt(head_dim) only", problems);
  } else {
    CompareFields(json, c, problems);
    // Llama has no position tensor: any model.max_seq_len up to the trained context loads.
    const Json positions = json.value("max_position_embeddings", Json(2048));
    if (positions.is_number() && c.max_seq_len > positions.get<double>()) {
      problems.push_back(absl::StrCat(
          "model.max_seq_len is ", c.max_seq_len, " but max_position_embeddings is ",
          positions.dump(), " (set model.max_seq_len to at most ", positions.dump(), ")"));
    }
    // A head_dim other than hidden_size / num_attention_heads (Gemma's, Qwen3's) is a shape
    // dtrain's Llama has no key for; the recipe's own width and heads are compared above.
    const Json hidden = json.value("hidden_size", Json(4096));
    const Json heads = json.value("num_attention_heads", Json(32));
    if (const Json head_dim = json.value("head_dim", Json());
        head_dim.is_number() && hidden.is_number() && heads.is_number() &&
        head_dim.get<double>() * heads.get<double>() != hidden.get<double>()) {
      problems.push_back(absl::StrCat(
          "head_dim is ", head_dim.dump(), " but hidden_size / num_attention_heads is ",
          hidden.dump(), " / ", heads.dump(),
          ": dtrain's head_dim is model.d_model / model.n_head, so it cannot run this model"));
    }
    RequireValue(json, "hidden_act", "silu", {"silu"}, "dtrain's Llama MLP is SwiGLU (silu)",
                 problems);
    // transformers reads {"rope_type": "default"} (or "type", its older key) as plain RoPE.
    const Json scaling = json.value("rope_scaling", Json());
    const bool plain_rope =
        scaling.is_null() ||
        (scaling.is_object() &&
         scaling.value("rope_type", scaling.value("type", Json())) == Json("default"));
    if (!plain_rope) {
      problems.push_back(absl::StrCat("rope_scaling is ", scaling.dump(),
                                      ": dtrain implements plain RoPE, no rope_scaling"));
    }
    RequireValue(json, "attention_bias", false, {false}, "dtrain's Llama has no biases", problems);
    RequireValue(json, "mlp_bias", false, {false}, "dtrain's Llama has no biases", problems);
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(path, " does not match the recipe's model: ", absl::StrJoin(problems, "; ")));
}

absl::StatusOr<std::string> FastTokenizerCaveat(const Tokenizer& tokenizer,
                                                const std::string& tokenizer_path) {
  ASSIGN_OR_RETURN(const TokenizerKind kind, FindTokenizer(tokenizer_path));
  if (kind.tokenizer_class != "LlamaTokenizer" ||
      !absl::StartsWith(tokenizer.name(), "sentencepiece:")) {
    return std::string();
  }
  // Llama's rules start a text with a word boundary ("a" as "▁a"), which a model made with
  // add_dummy_prefix: false does not.
  ASSIGN_OR_RETURN(const std::string serialized, ReadWholeFile(kind.copies.front().first.string()));
  std::string error;
  const std::unique_ptr<spm::Processor> processor = spm::Processor::Load(serialized, &error);
  std::vector<int> a_ids;
  if (processor != nullptr && processor->Encode("a", &a_ids, &error) && !a_ids.empty() &&
      !absl::StartsWith(processor->Piece(a_ids.front()), "\xe2\x96\x81")) {
    return absl::StrCat(
        "tokenizer ", tokenizer.name(),
        " adds no word boundary before a text (its model has add_dummy_prefix: false: \"a\" "
        "encodes as \"",
        processor->Piece(a_ids.front()),
        "\", not \"\xe2\x96\x81"
        "a\"), which transformers' fast tokenizer built from "
        "tokenizer.model does: load the folder's tokenizer with "
        "AutoTokenizer.from_pretrained(..., use_fast=False), or export it with a tokenizer.json "
        "converted from it");
  }
  // Pairs that Llama's rules keep apart and a normalizing model merges.
  for (const auto& [text, normalized] :
       {std::pair{"a  b", "a b"}, std::pair{"\xef\xac\x81", "fi"} /* U+FB01, NFKC "fi" */}) {
    std::vector<int32_t> ids, normalized_ids;
    RETURN_IF_ERROR(tokenizer.Encode(text, &ids));
    RETURN_IF_ERROR(tokenizer.Encode(normalized, &normalized_ids));
    if (ids != normalized_ids) continue;
    return absl::StrCat("tokenizer ", tokenizer.name(), " normalizes text (it encodes \"", text,
                        "\" as \"", normalized,
                        "\"), which transformers' fast tokenizer built from tokenizer.model does "
                        "not: load the folder's tokenizer with AutoTokenizer.from_pretrained(..., "
                        "use_fast=False), or export it with a tokenizer.json converted from it "
                        "(its normalizer kept)");
  }
  return std::string();
}

absl::StatusOr<HfSpecialTokens> CopyHfTokenizer(const std::string& tokenizer_path,
                                                const std::string& dir, int max_seq_len) {
  ASSIGN_OR_RETURN(const TokenizerKind kind, FindTokenizer(tokenizer_path));
  ASSIGN_OR_RETURN(const SpecialTokens special, FindSpecialTokens(kind));
  for (const auto& [from, name] : kind.copies)
    RETURN_IF_ERROR(CopyFile(from, fs::path(dir) / name));

  // A tokenizer_config.json beside the tokenizer (a Hugging Face folder's, with its chat
  // template) is the user's, with the folder's other tokenizer files, any of which it may load
  // (LlamaTokenizerFast with add_prefix_space rebuilds itself from tokenizer.model); else one
  // that AutoTokenizer accepts.
  const fs::path source_dir = kind.copies.front().first.parent_path();
  std::error_code error;
  std::set<std::string> copied;
  for (const auto& [from, name] : kind.copies) copied.insert(name);
  Json names = Json::object();
  for (const auto& [key, token] :
       {std::pair{"bos_token", special.bos}, std::pair{"eos_token", special.eos},
        std::pair{"unk_token", special.unk}}) {
    if (token) names[key] = token->content;
  }
  if (fs::exists(source_dir / "tokenizer_config.json", error)) {
    for (const char* name : {"tokenizer_config.json", "tokenizer.json", "tokenizer.model",
                             "vocab.json", "merges.txt", "added_tokens.json"}) {
      if (!copied.contains(name) && fs::exists(source_dir / name, error)) {
        RETURN_IF_ERROR(CopyFile(source_dir / name, fs::path(dir) / name));
      }
    }
  } else {
    Json config = names;
    config["tokenizer_class"] = kind.tokenizer_class;
    config["model_max_length"] = max_seq_len;
    config["clean_up_tokenization_spaces"] = false;
    if (kind.tokenizer_class == "GPT2Tokenizer") config["add_prefix_space"] = false;
    if (kind.tokenizer_class == "LlamaTokenizer") {
      config["add_bos_token"] = true;
      config["add_eos_token"] = false;
      // legacy: plain SentencePiece encoding (the non-legacy path also needs protobuf).
      config["legacy"] = true;
    }
    RETURN_IF_ERROR(WriteFileDurably((fs::path(dir) / "tokenizer_config.json").string(),
                                     config.dump(2) + "\n"));
  }
  if (fs::exists(source_dir / "special_tokens_map.json", error)) {
    RETURN_IF_ERROR(CopyFile(source_dir / "special_tokens_map.json",
                             fs::path(dir) / "special_tokens_map.json"));
  } else {
    RETURN_IF_ERROR(WriteFileDurably((fs::path(dir) / "special_tokens_map.json").string(),
                                     names.dump(2) + "\n"));
  }
  HfSpecialTokens ids;
  if (special.bos && special.bos->id >= 0) ids.bos_id = special.bos->id;
  if (special.eos && special.eos->id >= 0) ids.eos_id = special.eos->id;
  return ids;
}

absl::Status WriteByteTokenizer(const std::string& dir, int max_seq_len) {
  // Byte-level BPE without merges: each byte's character (GPT-2's alphabet) is the token whose id
  // is the byte, and no regex cuts the text first.
  Json vocab = Json::object();
  for (int byte = 0; byte < 256; ++byte) {
    vocab[ByteLevelCharacter(static_cast<unsigned char>(byte))] = byte;
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  const Json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", Json::array()},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", byte_level},
                          {"post_processor", nullptr},
                          {"decoder", byte_level},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"vocab", vocab},
                            {"merges", Json::array()}}}};
  const Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                       {"model_max_length", max_seq_len},
                       {"clean_up_tokenization_spaces", false}};
  RETURN_IF_ERROR(
      WriteFileDurably((fs::path(dir) / "tokenizer.json").string(), tokenizer.dump(2) + "\n"));
  RETURN_IF_ERROR(
      WriteFileDurably((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n"));
  return WriteFileDurably((fs::path(dir) / "special_tokens_map.json").string(), "{}\n");
}

namespace {

// The SFT template into `dir`'s tokenizer_config.json, and generation_config.json's stops: the
// tokenizer's end of sequence and the special tokens the assistant's suffix writes.
absl::Status WriteChatTemplate(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                               const HfSpecialTokens& tokens, const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  ASSIGN_OR_RETURN(Json config, ReadJson(config_path));
  config["chat_template"] = TemplateJinja(chat_template);
  RETURN_IF_ERROR(WriteFileDurably(config_path, config.dump(2) + "\n"));
  std::vector<int> stops;
  if (tokens.eos_id) stops.push_back(*tokens.eos_id);
  ChatTemplate suffix;
  suffix.roles["assistant"].suffix = chat_template.roles.at("assistant").suffix;
  for (const std::string& marker : TemplateMarkers(suffix)) {
    const absl::StatusOr<int32_t> id = tokenizer.SpecialToken(marker);
    if (id.ok() && !absl::c_linear_search(stops, *id)) stops.push_back(*id);
  }
  if (stops.empty()) return absl::OkStatus();
  Json generation = {{"eos_token_id", stops.size() == 1 ? Json(stops[0]) : Json(stops)}};
  if (tokens.bos_id) generation["bos_token_id"] = *tokens.bos_id;
  return WriteFileDurably((fs::path(dir) / "generation_config.json").string(),
                          generation.dump(2) + "\n");
}

// The files of an earlier export into `dir` (or of a Hugging Face folder) that this one may not
// write and transformers would read beside it (an old tokenizer.json wins over a new vocab.json
// pair), removed first: config.json before the others, since the folder is complete only once
// this export writes it again, and the folder's other files stay.
absl::Status ClearEarlierExport(const fs::path& dir) {
  // config.json first: a folder cleared part way is no model folder. model.safetensors is
  // written over.
  std::vector<fs::path> earlier = {dir / "config.json"};
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (IsHfFolderFile(name) && name != kWeightsName && name != "config.json") {
      earlier.push_back(entry.path());
    }
  }
  for (const fs::path& path : earlier) {
    if (fs::remove(path, error); error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot remove ", path.string(),
                       " of an earlier export from the model folder: ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsHfFolderFile(absl::string_view name) {
  for (const char* file :
       {"config.json", kWeightsName, kWeightsIndexName, "generation_config.json", "tokenizer.json",
        "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
        "vocab.json", "merges.txt"}) {
    if (name == file) return true;
  }
  // A sharded checkpoint's files.
  return absl::StartsWith(name, "model-") && absl::StrContains(name, "-of-") &&
         absl::EndsWith(name, ".safetensors");
}

bool HoldsDtrainExport(const std::string& dir) {
  const fs::path weights_path = fs::path(dir) / kWeightsName;
  std::error_code error;
  if (!fs::is_regular_file(fs::symlink_status(weights_path, error))) return false;
  const absl::StatusOr<SafetensorsReader> weights = SafetensorsReader::Open(weights_path);
  // dtrain_checkpoint: `dtrain ckpt export`'s, before the marker.
  return weights.ok() && (weights->metadata().contains(kExportMarkerKey) ||
                          weights->metadata().contains("dtrain_checkpoint"));
}

absl::Status CheckReplaceableModelFolder(const std::string& dir) {
  std::error_code error;
  std::vector<std::string> replaced;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (IsHfFolderFile(name)) replaced.push_back(name);
  }
  if (replaced.empty() || HoldsDtrainExport(dir)) return absl::OkStatus();
  absl::c_sort(replaced);
  return WithExitCode(
      absl::FailedPreconditionError(absl::StrCat(
          dir, " holds a model folder that dtrain did not export (", absl::StrJoin(replaced, ", "),
          "), which the export would replace: give an empty or new folder, or remove them (an "
          "export by dtrain before it marked its weights is refused too)")),
      kExitUsage);
}

absl::Status ExportHfFolder(const ModelConfig& config, const ParamTable& table,
                            const TensorValuesFn& read_tensor, const std::string& dir,
                            const std::string& tokenizer_path, const SafetensorsMetadata& metadata,
                            const ChatTemplate* chat_template) {
  RETURN_IF_ERROR(CheckReplaceableModelFolder(dir));
  std::unique_ptr<Tokenizer> tokenizer;
  const bool bytes = tokenizer_path == ByteTokenizer().name();
  if (bytes) {
    tokenizer = std::make_unique<ByteTokenizer>();
  } else if (!tokenizer_path.empty()) {
    ASSIGN_OR_RETURN(tokenizer, LoadTokenizer(tokenizer_path));
  }
  // Checked before the folder exists: with ids the model has no row for, the folder would load
  // in transformers and fail at its first forward pass (an index out of range).
  if (tokenizer != nullptr && tokenizer->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer ", tokenizer->name(), " has a vocabulary of ", tokenizer->vocab_size(),
        ", more than the model's ", config.vocab_size,
        " (model.vocab_size): its larger ids have no embedding row; give the tokenizer the "
        "model was trained with"));
  }
  std::error_code error;
  if (!bytes && tokenizer != nullptr) {
    ASSIGN_OR_RETURN(const std::string caveat, FastTokenizerCaveat(*tokenizer, tokenizer_path));
    if (!caveat.empty()) LogWarn("%s", caveat);
    fs::path source = fs::is_directory(tokenizer_path, error)
                          ? fs::path(tokenizer_path)
                          : fs::path(tokenizer_path).parent_path();
    if (source.empty()) source = ".";
    if (fs::equivalent(source, dir, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer ", tokenizer_path, " lies in the model folder ", dir,
                       ", whose tokenizer files the export replaces; give a copy of it elsewhere"));
    }
  }
  fs::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the model folder ", dir, ": ", error.message()));
  }
  RETURN_IF_ERROR(ClearEarlierExport(dir));
  // The weights, which mark the folder as an export, before the tokenizer's files: an export cut
  // short after them is the retry's to replace (CheckReplaceableModelFolder).
  RETURN_IF_ERROR(ExportHfSafetensorsStreamed(config, table, read_tensor,
                                              (fs::path(dir) / kWeightsName).string(), metadata));
  HfSpecialTokens tokens;
  if (bytes) {
    RETURN_IF_ERROR(WriteByteTokenizer(dir, config.max_seq_len));
  } else if (tokenizer != nullptr) {
    ASSIGN_OR_RETURN(tokens, CopyHfTokenizer(tokenizer_path, dir, config.max_seq_len));
  }
  if (tokenizer != nullptr && chat_template != nullptr) {
    RETURN_IF_ERROR(WriteChatTemplate(*chat_template, *tokenizer, tokens, dir));
  }
  return WriteFileDurably((fs::path(dir) / "config.json").string(), HfConfigJson(config, tokens));
}

absl::StatusOr<bool> HfLlamaTiesHead(const ModelConfig& config, const std::string& path) {
  std::error_code error;
  if (config.family != ModelFamily::kLlama || !fs::is_directory(path, error)) return false;
  ASSIGN_OR_RETURN(const Json json, ReadJson((fs::path(path) / "config.json").string()));
  const auto tie = json.find("tie_word_embeddings");
  return tie != json.end() && tie->is_boolean() && tie->get<bool>();
}

absl::Status ImportHfWeights(const ModelConfig& config, const ParamTable& table,
                             const std::string& path, const TensorSinkFn& write_tensor) {
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    return ImportHfSafetensors(config, table, {path}, path, write_tensor);
  }
  const fs::path dir(path);
  if (!fs::exists(dir / "config.json", error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " is a folder without config.json; give a .safetensors file or a Hugging "
                     "Face model folder (config.json + model.safetensors)"));
  }
  RETURN_IF_ERROR(CheckHfConfig(config, (dir / "config.json").string()));
  ASSIGN_OR_RETURN(const bool tied, HfLlamaTiesHead(config, path));
  if (fs::exists(dir / kWeightsName, error)) {
    return ImportHfSafetensors(config, table, {(dir / kWeightsName).string()}, path, write_tensor,
                               tied);
  }
  if (!fs::exists(dir / kWeightsIndexName, error)) {
    return absl::NotFoundError(absl::StrCat(
        path, " has config.json but no ", kWeightsName, " or ", kWeightsIndexName,
        "; save the model with safetensors (save_pretrained's default; dtrain reads no "
        "pytorch_model.bin)"));
  }
  const std::string index_path = (dir / kWeightsIndexName).string();
  ASSIGN_OR_RETURN(const Json index, ReadJson(index_path));
  const auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, " has no \"weight_map\" object (tensor name -> file)"));
  }
  std::set<std::string> shards;
  for (const auto& [tensor, file] : weight_map->items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", tensor, "' maps to ",
                                                     file.dump(),
                                                     ", not a file name in the folder"));
    }
    shards.insert(file.get<std::string>());
  }
  std::vector<std::string> files;
  for (const std::string& shard : shards) files.push_back((dir / shard).string());
  return ImportHfSafetensors(config, table, files, path, write_tensor, tied);
}

absl::Status ImportHfWeights(const ModelConfig& config, const ParamTable& table,
                             const std::string& path, float* params) {
  return ImportHfWeights(config, table, path, CopyIntoParams(params));
}

absl::Status CheckHfWeights(const ModelConfig& config, const std::string& path) {
  return ImportHfWeights(config, ParamTable(config, ModelSlice{}), path, TensorSinkFn());
}

}  // namespace dtrain
