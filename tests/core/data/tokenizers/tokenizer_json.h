// Small BPE tokenizer.json files for tests, byte-level and SentencePiece-style, built by hand so
// that the expected ids follow from the merges written in the test.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::testing {

// GPT-2's bytes_to_unicode, written out independently of the code under test.
inline std::string ByteLevelChar(int byte) {
  int codepoint = byte;
  const bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
  if (!printable) {
    codepoint = 256;
    for (int b = 0; b < byte; ++b) {
      if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) ++codepoint;
    }
  }
  std::string text;
  if (codepoint < 0x80) {
    text.push_back(static_cast<char>(codepoint));
  } else {
    text.push_back(static_cast<char>(0xC0 | (codepoint >> 6)));
    text.push_back(static_cast<char>(0x80 | (codepoint & 0x3F)));
  }
  return text;
}

inline std::string ByteLevel(const std::string& bytes) {
  std::string text;
  for (const unsigned char c : bytes) text += ByteLevelChar(c);
  return text;
}

// A GPT-2-style tokenizer.json: the 256 bytes as ids 0..255, then one id per merge result, and
// `added` after those.
inline nlohmann::json TokenizerJson(const std::vector<std::pair<std::string, std::string>>& merges,
                                    const std::vector<std::string>& added = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(b)] = b;
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [left, right] : merges) {
    vocab[ByteLevel(left + right)] = static_cast<int>(vocab.size());
    merge_list.push_back({ByteLevel(left), ByteLevel(right)});
  }
  nlohmann::json added_tokens = nlohmann::json::array();
  for (const std::string& content : added) {
    added_tokens.push_back({{"id", static_cast<int>(vocab.size() + added_tokens.size())},
                            {"content", content},
                            {"special", true},
                            {"normalized", false}});
  }
  return {
      {"version", "1.0"},
      {"added_tokens", added_tokens},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

// A tokenizer.json as transformers writes Llama 2's: <unk> <s> </s> as ids 0..2, the 256
// byte-fallback tokens <0x00>..<0xFF> as 3..258, then `characters` and one id per merge result;
// normalizer Prepend("▁") + Replace(" " -> "▁"), no pre-tokenizer, byte_fallback and fuse_unk,
// and the decoder Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0).
inline nlohmann::json Llama2TokenizerJson(
    const std::vector<std::string>& characters,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  using nlohmann::json;
  const std::string space = "\xe2\x96\x81";
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = static_cast<int>(vocab.size());
  }
  for (const std::string& character : characters) vocab[character] = static_cast<int>(vocab.size());
  json merge_list = json::array();
  for (const auto& [left, right] : merges) {
    vocab[left + right] = static_cast<int>(vocab.size());
    merge_list.push_back({left, right});
  }
  json added_tokens = json::array();
  for (const char* content : {"<unk>", "<s>", "</s>"}) {
    added_tokens.push_back(
        {{"id", vocab[content]}, {"content", content}, {"special", true}, {"normalized", false}});
  }
  const json replace_space = {
      {"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}};
  return {{"version", "1.0"},
          {"added_tokens", added_tokens},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers", {{{"type", "Prepend"}, {"prepend", space}}, replace_space}}}},
          {"pre_tokenizer", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

}  // namespace dtrain::testing
