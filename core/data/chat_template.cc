#include "core/data/chat_template.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/files.h"

namespace dtrain {
namespace {

// Whether Python's str.isspace() holds for code point `c`: what Jinja's `trim` (str.strip())
// strips, so that a rendered conversation equals the exported template's.
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// The code point of the UTF-8 sequence at text[at] (JSON strings are valid UTF-8) and its length
// in bytes.
std::pair<char32_t, size_t> CodePointAt(absl::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[at + i]); };
  const unsigned char lead = byte(0);
  const size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  if (at + length > text.size()) return {0xFFFD, text.size() - at};  // cut short: no space
  char32_t c = length == 1 ? lead : lead & (0xFF >> (length + 1));
  for (size_t i = 1; i < length; ++i) c = (c << 6) | (byte(i) & 0x3F);
  return {c, length};
}

// `text` without leading and trailing Python whitespace (IsPythonSpace).
absl::string_view StripPythonWhitespace(absl::string_view text) {
  while (!text.empty()) {
    const auto [c, length] = CodePointAt(text, 0);
    if (!IsPythonSpace(c)) break;
    text.remove_prefix(length);
  }
  while (!text.empty()) {
    size_t start = text.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    if (!IsPythonSpace(CodePointAt(text, start).first)) break;
    text.remove_suffix(text.size() - start);
  }
  return text;
}

ChatTemplate Llama3() {
  ChatTemplate t{.name = "llama3", .begin = "<|begin_of_text|>", .trim = true};
  for (const char* role : {"system", "user", "assistant", "ipython"}) {
    t.roles[role] = {absl::StrCat("<|start_header_id|>", role, "<|end_header_id|>\n\n"),
                     "<|eot_id|>"};
  }
  return t;
}

ChatTemplate ChatMl() {
  ChatTemplate t{.name = "chatml"};
  for (const char* role : {"system", "user", "assistant", "tool"}) {
    t.roles[role] = {absl::StrCat("<|im_start|>", role, "\n"), "<|im_end|>", "\n"};
  }
  return t;
}

ChatTemplate NoTemplate() {
  ChatTemplate t{.name = "none"};
  for (const char* role : {"system", "user", "assistant"}) t.roles[role] = {};
  return t;
}

absl::Status FileError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "chat template ", path, ": ", what,
      "; see README.md (SFT data) for the format: {\"begin\": ..., \"roles\": {\"assistant\": "
      "{\"prefix\": ..., \"suffix\": ...}, ...}}"));
}

// An error naming the first key of `json` (at `field`) not among `known`, which a typo makes
// ("sufix": a template without its end-of-turn marker); OK when there is none.
absl::Status UnknownKey(const nlohmann::json& json, const std::string& path,
                        const std::string& field, std::initializer_list<const char*> known) {
  for (const auto& [key, value] : json.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    return FileError(path, absl::StrCat("unknown key \"", key, "\"", field.empty() ? "" : " in ",
                                        field, " (the keys are ", absl::StrJoin(known, ", "), ")"));
  }
  return absl::OkStatus();
}

// *out = the string at json[key] when present; an error when it is there but not a string.
absl::Status OptionalString(const nlohmann::json& json, const char* key, const std::string& path,
                            const std::string& field, std::string* out) {
  if (!json.contains(key)) return absl::OkStatus();
  if (!json[key].is_string()) return FileError(path, absl::StrCat(field, " is not a string"));
  *out = json[key].get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<ChatTemplate> LoadTemplateFile(const std::string& path) {
  const absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat("chat template '", path,
                     "' is neither a built-in one (llama3, chatml, none) nor a readable file"));
  }
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("chat template: ", text.status().message()));
  }
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::parse_error& error) {
    return FileError(path, absl::StrCat("not valid JSON (byte ", error.byte,
                                        "); a template file is JSON, not Jinja, which dtrain "
                                        "does not render"));
  }
  if (!json.is_object()) return FileError(path, "not a JSON object");
  if (json.contains("chat_template") && !json.contains("roles")) {
    return FileError(path,
                     "a Jinja chat_template (a tokenizer_config.json's), which dtrain does not "
                     "render; write its turns as a template file of \"roles\" (README, "
                     "\"Supervised fine-tuning\") or use a built-in one");
  }
  return ParseTemplateJson(json, path);
}

}  // namespace

absl::StatusOr<ChatTemplate> ParseTemplateJson(const nlohmann::json& json,
                                               const std::string& path) {
  if (!json.is_object()) return FileError(path, "not a JSON object");
  absl::Status status = UnknownKey(json, path, "", {"name", "begin", "trim", "roles"});
  if (!status.ok()) return status;
  ChatTemplate t{.name = path};
  status = OptionalString(json, "begin", path, "\"begin\"", &t.begin);
  if (!status.ok()) return status;
  if (json.contains("trim")) {
    if (!json["trim"].is_boolean()) return FileError(path, "\"trim\" is not true or false");
    t.trim = json["trim"].get<bool>();
  }
  if (!json.contains("roles") || !json["roles"].is_object()) {
    return FileError(path, "no \"roles\" object");
  }
  for (const auto& [role, format] : json["roles"].items()) {
    const std::string field = absl::StrCat("roles.", role);
    if (!format.is_object()) return FileError(path, absl::StrCat(field, " is not an object"));
    status = UnknownKey(format, path, field, {"prefix", "suffix", "after"});
    if (!status.ok()) return status;
    ChatTurnFormat& turn = t.roles[role];
    for (const auto& [key, out] :
         {std::pair{"prefix", &turn.prefix}, {"suffix", &turn.suffix}, {"after", &turn.after}}) {
      status = OptionalString(format, key, path, absl::StrCat(field, ".", key), out);
      if (!status.ok()) return status;
    }
  }
  if (!t.roles.contains("assistant")) {
    return FileError(path, "roles has no \"assistant\", the role the model is trained on");
  }
  return t;
}

nlohmann::json TemplateJson(const ChatTemplate& chat_template) {
  nlohmann::json roles = nlohmann::json::object();
  for (const auto& [role, format] : chat_template.roles) {
    roles[role] = {{"prefix", format.prefix}, {"suffix", format.suffix}, {"after", format.after}};
  }
  return {{"name", chat_template.name},
          {"begin", chat_template.begin},
          {"trim", chat_template.trim},
          {"roles", roles}};
}

std::string TemplateJinja(const ChatTemplate& chat_template) {
  // A Jinja string literal: JSON's escapes are Jinja's too.
  const auto literal = [](const std::string& text) { return nlohmann::json(text).dump(); };
  const std::string content =
      chat_template.trim ? "(message['content'] | trim)" : "message['content']";
  std::string jinja =
      absl::StrCat("{{ ", literal(chat_template.begin), " }}{% for message in messages %}");
  const char* keyword = "if";
  for (const auto& [role, format] : chat_template.roles) {
    absl::StrAppend(&jinja, "{% ", keyword, " message['role'] == ", literal(role), " %}{{ ",
                    literal(format.prefix), " + ", content, " + ",
                    literal(format.suffix + format.after), " }}");
    keyword = "elif";
  }
  std::vector<std::string> known;
  for (const auto& [role, format] : chat_template.roles) known.push_back(role);
  absl::StrAppend(&jinja, "{% else %}{{ raise_exception('role ' + message['role'] + ",
                  literal(absl::StrCat(" is not one of ", absl::StrJoin(known, ", "))),
                  ") }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ ",
                  literal(chat_template.roles.at("assistant").prefix), " }}{% endif %}");
  return jinja;
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& name_or_path) {
  if (name_or_path == "llama3") return Llama3();
  if (name_or_path == "chatml") return ChatMl();
  if (name_or_path == "none") return NoTemplate();
  return LoadTemplateFile(name_or_path);
}

absl::StatusOr<std::vector<TextSegment>> RenderConversation(
    const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages) {
  std::vector<TextSegment> segments;
  if (!chat_template.begin.empty()) segments.push_back({chat_template.begin, false});
  for (const ChatMessage& message : messages) {
    const auto it = chat_template.roles.find(message.role);
    if (it == chat_template.roles.end()) {
      std::vector<std::string> known;
      for (const auto& [role, format] : chat_template.roles) known.push_back(role);
      return absl::InvalidArgumentError(absl::StrCat("role \"", message.role, "\" is not one of ",
                                                     chat_template.name, "'s roles (",
                                                     absl::StrJoin(known, ", "), ")"));
    }
    const bool trained = message.role == "assistant";
    const absl::string_view content = chat_template.trim ? StripPythonWhitespace(message.content)
                                                         : absl::string_view(message.content);
    if (trained && content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", &message - messages.data() + 1, " of ", messages.size(),
          " (the assistant's) has no text: it would train its end-of-turn marker alone, a model "
          "taught to say nothing; drop the line or add the answer"));
    }
    const ChatTurnFormat& format = it->second;
    if (!format.prefix.empty()) segments.push_back({format.prefix, false});
    segments.push_back({std::string(content), trained});
    if (!format.suffix.empty()) segments.push_back({format.suffix, trained});
    if (!format.after.empty()) segments.push_back({format.after, false});
  }
  return segments;
}

std::vector<std::string> TemplateMarkers(const ChatTemplate& chat_template) {
  std::vector<std::string> markers;
  const auto scan = [&markers](const std::string& text) {
    for (size_t at = text.find("<|"); at != std::string::npos; at = text.find("<|", at + 2)) {
      const size_t end = text.find("|>", at + 2);
      if (end == std::string::npos) return;
      std::string marker = text.substr(at, end + 2 - at);
      if (std::find(markers.begin(), markers.end(), marker) == markers.end()) {
        markers.push_back(std::move(marker));
      }
    }
  };
  scan(chat_template.begin);
  for (const auto& [role, format] : chat_template.roles) {
    scan(format.prefix);
    scan(format.suffix);
    scan(format.after);
  }
  return markers;
}

}  // namespace dtrain
