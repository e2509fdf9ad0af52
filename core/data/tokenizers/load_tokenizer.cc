#include "core/data/tokenizers/load_tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/data/tokenizers/bpe.h"
#include "core/data/tokenizers/sentencepiece_tokenizer.h"
#include "core/util/files.h"
#include "core/util/fnv.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path.string());
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read tokenizer file: ", text.status().message()));
  }
  return text;
}

std::string TokenizerName(std::string_view kind, const fs::path& path, uint64_t hash) {
  const fs::path absolute = fs::absolute(path).lexically_normal();
  const std::string folder = absolute.parent_path().filename().string();
  return absl::StrFormat("%s:%s%s#%012x", kind, folder.empty() ? "" : folder + "/",
                         absolute.filename().string(), hash >> 16);
}

absl::StatusOr<json> ParseJson(const std::string& text, const fs::path& path) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& error) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not valid JSON (byte ",
                                                   error.byte, "); re-download or re-save it"));
  }
}

absl::Status FileError(const fs::path& path, const absl::Status& cause) {
  return absl::Status(cause.code(), absl::StrCat(path.string(), ": ", cause.message()));
}

// A token of a byte-level file as raw bytes; a token outside the byte-level alphabet (possible
// for added tokens only) is kept as its own text.
std::string TokenBytes(const std::string& token) {
  std::string bytes;
  return ByteLevelToBytes(token, &bytes) ? bytes : token;
}

std::string TypeOf(const json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : node.dump();
}

// Hugging Face's pre-tokenizers that byte-level BPE uses: ByteLevel alone (GPT-2), or a
// Sequence of Split regexes (behavior Isolated) and a ByteLevel (Llama 3).
absl::Status ReadPreTokenizer(const json& node, BpeSpec* spec, bool* byte_level) {
  const std::string type = TypeOf(node);
  if (type == "Sequence" && node.contains("pretokenizers") && node["pretokenizers"].is_array()) {
    for (const json& child : node["pretokenizers"]) {
      RETURN_IF_ERROR(ReadPreTokenizer(child, spec, byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (node.value("add_prefix_space", false)) {
      if (!spec->split_patterns.empty()) {
        return absl::UnimplementedError(
            "pre_tokenizer ByteLevel with add_prefix_space after a Split is not supported");
      }
      spec->add_prefix_space = true;
    }
    if (node.value("use_regex", true)) spec->split_patterns.push_back(kGpt2SplitPattern);
    *byte_level = true;
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    return absl::UnimplementedError(
        "pre_tokenizer Metaspace inside a Sequence is not supported (dtrain reads it alone, as "
        "Llama 2's and SentencePieceBPETokenizer's files have it)");
  }
  if (type == "Split") {
    const json& pattern = node.value("pattern", json());
    const std::string behavior = node.value("behavior", "");
    if (behavior != "Isolated" || node.value("invert", false)) {
      return absl::UnimplementedError(
          absl::StrCat("pre_tokenizer Split with behavior '", behavior,
                       "' is not supported (dtrain reads Isolated, as GPT-2 and Llama 3 use)"));
    }
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      spec->split_patterns.push_back(pattern["Regex"].get<std::string>());
    } else {
      return absl::UnimplementedError(
          absl::StrCat("pre_tokenizer Split with pattern ", pattern.dump(),
                       " is not supported (dtrain reads {\"Regex\": ...})"));
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat(
      "pre_tokenizer ", type,
      " is not supported: dtrain reads byte-level BPE (ByteLevel, or Split then ByteLevel) and "
      "SentencePiece-style BPE (Metaspace, or none)"));
}

std::string StringPattern(const json& node) {
  const json& pattern = node.value("pattern", json());
  return pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()
             ? pattern["String"].get<std::string>()
             : std::string();
}

// Normalizers (Llama 2's Prepend and Replace, SentencePieceBPETokenizer's NFKC, Qwen2's
// byte-level NFC) and Sequences of them.
absl::Status ReadNormalizer(const json& node, std::vector<NormalizerStep>* steps) {
  const std::string type = TypeOf(node);
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (const json& child : node["normalizers"]) RETURN_IF_ERROR(ReadNormalizer(child, steps));
    return absl::OkStatus();
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    steps->push_back({NormalizerStep::Kind::kUnicode, type, "", ""});
    return absl::OkStatus();
  }
  if (type == "Prepend" && node.value("prepend", json()).is_string()) {
    steps->push_back({NormalizerStep::Kind::kPrepend, "", "", node["prepend"].get<std::string>()});
    return absl::OkStatus();
  }
  if (type == "Replace" && !StringPattern(node).empty() &&
      node.value("content", json()).is_string()) {
    steps->push_back({NormalizerStep::Kind::kReplace, "", StringPattern(node),
                      node["content"].get<std::string>()});
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("normalizer ", node.dump().substr(0, 200),
                   " is not supported (dtrain reads NFC, NFD, NFKC, NFKD, Prepend, Replace of a "
                   "String pattern, and Sequences of them)"));
}

// Metaspace's settings, as pre-tokenizer or decoder; files before tokenizers 0.19 say
// add_prefix_space instead of prepend_scheme.
absl::StatusOr<MetaspaceSpec> ReadMetaspace(const json& node) {
  MetaspaceSpec spec;
  spec.replacement = node.value("replacement", std::string(kMetaspace));
  spec.split = node.value("split", true);
  const std::string scheme =
      node.value("prepend_scheme", node.value("add_prefix_space", true) ? "always" : "never");
  if (scheme == "always") {
    spec.prepend_scheme = PrependScheme::kAlways;
  } else if (scheme == "first") {
    spec.prepend_scheme = PrependScheme::kFirst;
  } else if (scheme == "never") {
    spec.prepend_scheme = PrependScheme::kNever;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("Metaspace prepend_scheme '", scheme, "' is none of always, first, never"));
  }
  if (spec.replacement.empty()) {
    return absl::InvalidArgumentError("Metaspace replacement is empty");
  }
  return spec;
}

// The decoders of SentencePiece-style files: Llama 2's Sequence of Replace, ByteFallback, Fuse
// and Strip, or Metaspace.
absl::Status ReadDecoder(const json& node, std::vector<DecoderStep>* steps) {
  const std::string type = TypeOf(node);
  DecoderStep step;
  if (type == "Sequence" && node.contains("decoders") && node["decoders"].is_array()) {
    for (const json& child : node["decoders"]) RETURN_IF_ERROR(ReadDecoder(child, steps));
    return absl::OkStatus();
  } else if (type == "Replace" && !StringPattern(node).empty() &&
             node.value("content", json()).is_string()) {
    step = {DecoderStep::Kind::kReplace, StringPattern(node), node["content"].get<std::string>()};
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip" && node.value("content", json()).is_string()) {
    step = {DecoderStep::Kind::kStrip, "", node["content"].get<std::string>(),
            node.value("start", 0), node.value("stop", 0)};
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    ASSIGN_OR_RETURN(step.metaspace, ReadMetaspace(node));
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "decoder ", node.dump().substr(0, 200),
        " is not supported (dtrain reads Replace, ByteFallback, Fuse, Strip, Metaspace and "
        "Sequences of them)"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

// The file's normalizer (none: no steps), which runs before either alphabet's pre-tokenizer.
absl::Status ReadFileNormalizer(const json& root, BpeSpec* spec) {
  std::vector<NormalizerStep> steps;
  if (const json& normalizer = root.value("normalizer", json()); !normalizer.is_null()) {
    RETURN_IF_ERROR(ReadNormalizer(normalizer, &steps));
  }
  ASSIGN_OR_RETURN(spec->normalizer, Normalizer::Make(std::move(steps)));
  return absl::OkStatus();
}

// A tokenizer.json without a ByteLevel pre-tokenizer: the character alphabet with its
// normalizer, Metaspace pre-tokenizer (or none), byte fallback and decoder.
absl::Status ReadSentencePieceStyle(const json& root, BpeSpec* spec) {
  spec->byte_level = false;
  RETURN_IF_ERROR(ReadFileNormalizer(root, spec));
  if (const json& pre_tokenizer = root.value("pre_tokenizer", json()); !pre_tokenizer.is_null()) {
    ASSIGN_OR_RETURN(spec->metaspace, ReadMetaspace(pre_tokenizer));
  }
  if (const json& decoder = root.value("decoder", json()); !decoder.is_null()) {
    RETURN_IF_ERROR(ReadDecoder(decoder, &spec->decoder));
  }
  const json& model = root["model"];
  spec->byte_fallback = model.value("byte_fallback", false);
  spec->fuse_unk = model.value("fuse_unk", false);
  if (const json& unk = model.value("unk_token", json()); unk.is_string()) {
    spec->unk_token = unk.get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerJson(const fs::path& path, int threads) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(const json root, ParseJson(text, path));
  const auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", what));
  };
  const auto unsupported = [&](const std::string& what) {
    return absl::UnimplementedError(absl::StrCat(path.string(), ": ", what));
  };
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) {
    return invalid("no \"model\" object; is this a Hugging Face tokenizer.json?");
  }
  const json& model = root["model"];
  if (model.value("type", "BPE") != "BPE") {
    return unsupported(absl::StrCat("model type ", model["type"].dump(),
                                    " is not supported: dtrain reads BPE from tokenizer.json "
                                    "and SentencePiece models from tokenizer.model"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      return unsupported(absl::StrCat("model.", key, " is not supported"));
    }
  }
  BpeSpec spec;
  bool byte_level = false;
  const json& pre_tokenizer = root.value("pre_tokenizer", json());
  if (!pre_tokenizer.is_null() && TypeOf(pre_tokenizer) != "Metaspace") {
    if (absl::Status status = ReadPreTokenizer(pre_tokenizer, &spec, &byte_level); !status.ok()) {
      return FileError(path, status);
    }
  }
  if (absl::Status status =
          byte_level ? ReadFileNormalizer(root, &spec) : ReadSentencePieceStyle(root, &spec);
      !status.ok()) {
    return FileError(path, status);
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return invalid("model.vocab is not an object of token: id");
  }
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      return invalid(absl::StrCat("model.vocab[\"", token, "\"] is not an id"));
    spec.vocab.emplace_back(byte_level ? TokenBytes(token) : token, id.get<int32_t>());
  }
  const json& merges = model.value("merges", json::array());
  if (!merges.is_array()) return invalid("model.merges is not a list");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    std::string left, right;
    if (merge.is_string()) {  // "a b", the format before tokenizers 0.20
      const std::string& pair = merge.get_ref<const std::string&>();
      const size_t space = pair.find(' ');
      if (space == std::string::npos) {
        return invalid(absl::StrCat("model.merges[", i, "] \"", pair, "\" is not two tokens"));
      }
      left = pair.substr(0, space);
      right = pair.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return invalid(absl::StrCat("model.merges[", i, "] is not a pair of tokens"));
    }
    if (byte_level) {
      spec.merges.emplace_back(TokenBytes(left), TokenBytes(right));
    } else {
      spec.merges.emplace_back(std::move(left), std::move(right));
    }
  }
  spec.ignore_merges = model.value("ignore_merges", false);
  for (const json& added : root.value("added_tokens", json::array())) {
    if (!added.is_object() || !added.contains("content") || !added["content"].is_string() ||
        !added.contains("id") || !added["id"].is_number_integer()) {
      return invalid(absl::StrCat("added_tokens entry ", added.dump(),
                                  " lacks a \"content\" string or an \"id\""));
    }
    AddedToken token{added["content"].get<std::string>(), added["id"].get<int32_t>(),
                     added.value("lstrip", false), added.value("rstrip", false),
                     added.value("single_word", false)};
    // Hugging Face matches the tokens that skip the normalizer first, then the others.
    (added.value("normalized", !added.value("special", false)) ? spec.normal_added
                                                               : spec.special_added)
        .push_back(std::move(token));
  }
  spec.name = TokenizerName("hf-bpe", path, Fnv1a(text));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = MakeBpe(std::move(spec), threads);
  if (!tokenizer.ok()) return FileError(path, tokenizer.status());
  return tokenizer;
}

// GPT-2's original files: a JSON map token -> id and a text file of merges, one "a b" a line
// after a "#version" line. <|endoftext|> is special, as in transformers' GPT2Tokenizer.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Files(const fs::path& encoder_path,
                                                         const fs::path& merges_path, int threads) {
  ASSIGN_OR_RETURN(const std::string encoder_text, ReadFile(encoder_path));
  ASSIGN_OR_RETURN(const std::string merges_text, ReadFile(merges_path));
  ASSIGN_OR_RETURN(const json encoder, ParseJson(encoder_text, encoder_path));
  if (!encoder.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(encoder_path.string(), ": not a JSON object of token: id"));
  }
  BpeSpec spec;
  for (const auto& [token, id] : encoder.items()) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(encoder_path.string(), ": \"", token, "\" has no integer id"));
    }
    spec.vocab.emplace_back(TokenBytes(token), id.get<int32_t>());
    if (token == "<|endoftext|>") spec.special_added.push_back({token, id.get<int32_t>()});
  }
  size_t line_begin = 0;
  for (int line_number = 1; line_begin < merges_text.size(); ++line_number) {
    size_t line_end = merges_text.find('\n', line_begin);
    if (line_end == std::string::npos) line_end = merges_text.size();
    std::string_view line(merges_text.data() + line_begin, line_end - line_begin);
    line_begin = line_end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.substr(0, 8) == "#version")) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          merges_path.string(), ":", line_number, ": \"",
          absl::CHexEscape(absl::string_view(line.data(), std::min<size_t>(line.size(), 80))),
          "\" is not a merge \"a b\""));
    }
    spec.merges.emplace_back(TokenBytes(std::string(line.substr(0, space))),
                             TokenBytes(std::string(line.substr(space + 1))));
  }
  spec.split_patterns.push_back(kGpt2SplitPattern);
  uint64_t hash = Fnv1a(encoder_text);
  for (const unsigned char c : merges_text) hash = FnvMix(hash, c);
  spec.name = TokenizerName("gpt2-bpe", encoder_path, hash);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = MakeBpe(std::move(spec), threads);
  if (!tokenizer.ok()) return FileError(merges_path, tokenizer.status());
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceFile(const fs::path& path) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      MakeSentencePiece(bytes, TokenizerName("sentencepiece", path, Fnv1a(bytes)));
  if (!tokenizer.ok()) return FileError(path, tokenizer.status());
  return tokenizer;
}

// The GPT-2 pair in `folder`, under either naming; an empty pair when neither is complete.
std::pair<fs::path, fs::path> Gpt2Pair(const fs::path& folder) {
  for (const auto& [encoder, merges] :
       {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}}) {
    if (fs::is_regular_file(folder / encoder) && fs::is_regular_file(folder / merges)) {
      return {folder / encoder, folder / merges};
    }
  }
  return {};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path_text,
                                                         int threads) {
  if (path_text.empty() || path_text == ByteTokenizer().name()) {
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  }
  const fs::path path(path_text);
  std::error_code error;
  if (fs::is_directory(path, error)) {
    const fs::path json_path = path / "tokenizer.json";
    const fs::path model_path = path / "tokenizer.model";
    if (fs::is_regular_file(json_path)) {
      absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
          LoadHfTokenizerJson(json_path, threads);
      if (tokenizer.ok() || !absl::IsUnimplemented(tokenizer.status()) ||
          !fs::is_regular_file(model_path)) {
        return tokenizer;
      }
    }
    if (fs::is_regular_file(model_path)) return LoadSentencePieceFile(model_path);
    const auto [encoder, merges] = Gpt2Pair(path);
    if (!encoder.empty()) return LoadGpt2Files(encoder, merges, threads);
    return absl::NotFoundError(absl::StrCat(
        "tokenizer folder ", path_text,
        " holds no tokenizer.json, tokenizer.model, encoder.json + vocab.bpe or vocab.json + "
        "merges.txt; give the folder of a model's tokenizer files"));
  }
  if (!fs::exists(path, error)) {
    return absl::NotFoundError(
        absl::StrCat("tokenizer file ", path_text,
                     " does not exist; give a tokenizer.json, tokenizer.model, GPT-2's "
                     "encoder.json/vocab.bpe, or their folder"));
  }
  const std::string file = path.filename().string();
  if (file == "encoder.json" || file == "vocab.bpe" || file == "vocab.json" ||
      file == "merges.txt") {
    const auto [encoder, merges] = Gpt2Pair(path.parent_path().empty() ? "." : path.parent_path());
    if (encoder.empty()) {
      return absl::NotFoundError(
          absl::StrCat(path_text,
                       " is half of GPT-2's tokenizer; put encoder.json and vocab.bpe (or "
                       "vocab.json and merges.txt) in one folder"));
    }
    return LoadGpt2Files(encoder, merges, threads);
  }
  if (absl::EndsWith(file, ".model")) return LoadSentencePieceFile(path);
  if (absl::EndsWith(file, ".json")) return LoadHfTokenizerJson(path, threads);
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer file ", path_text,
      " is of no kind dtrain reads: give a tokenizer.json, a SentencePiece .model, GPT-2's "
      "encoder.json/vocab.bpe, or their folder"));
}

}  // namespace dtrain
