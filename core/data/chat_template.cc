#include "core/data/chat_template.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

ChatTemplate Llama3() {
  ChatTemplate t{.name = "llama3", .begin = "<|begin_of_text|>"};
  for (const char* role : {"system", "user", "assistant", "ipython"}) {
    t.roles[role] = {absl::StrCat("<|start_header_id|>", role, "<|end_header_id|>\n\n"),
                     "<|eot_id|>"};
  }
  return t;
}

ChatTemplate ChatMl() {
  ChatTemplate t{.name = "chatml"};
  for (const char* role : {"system", "user", "assistant", "tool"}) {
    t.roles[role] = {absl::StrCat("<|im_start|>", role, "\n"), "<|im_end|>\n"};
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

// *out = the string at json[key] when present; an error when it is there but not a string.
absl::Status OptionalString(const nlohmann::json& json, const char* key, const std::string& path,
                            const std::string& field, std::string* out) {
  if (!json.contains(key)) return absl::OkStatus();
  if (!json[key].is_string()) return FileError(path, absl::StrCat(field, " is not a string"));
  *out = json[key].get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<ChatTemplate> LoadTemplateFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("chat template '", path,
                     "' is neither a built-in one (llama3, chatml, none) nor a readable file"));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) return FileError(path, "not a JSON object");
  ChatTemplate t{.name = path};
  absl::Status status = OptionalString(json, "begin", path, "\"begin\"", &t.begin);
  if (!status.ok()) return status;
  if (!json.contains("roles") || !json["roles"].is_object()) {
    return FileError(path, "no \"roles\" object");
  }
  for (const auto& [role, format] : json["roles"].items()) {
    const std::string field = absl::StrCat("roles.", role);
    if (!format.is_object()) return FileError(path, absl::StrCat(field, " is not an object"));
    ChatTurnFormat& turn = t.roles[role];
    for (const auto& [key, out] : {std::pair{"prefix", &turn.prefix}, {"suffix", &turn.suffix}}) {
      status = OptionalString(format, key, path, absl::StrCat(field, ".", key), out);
      if (!status.ok()) return status;
    }
  }
  if (!t.roles.contains("assistant")) {
    return FileError(path, "roles has no \"assistant\", the role the model is trained on");
  }
  return t;
}

}  // namespace

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
    if (!it->second.prefix.empty()) segments.push_back({it->second.prefix, false});
    segments.push_back({message.content, trained});
    if (!it->second.suffix.empty()) segments.push_back({it->second.suffix, trained});
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
  }
  return markers;
}

}  // namespace dtrain
