// Chat templates: how a conversation's messages become one sample's text, and which of that text
// the model is trained to produce (the loss mask of supervised fine-tuning).
//
// A template is a text at the start of every sample and, per role, a prefix and a suffix around
// each message's content, then a text after them. The assistant's content and suffix are trained
// (the suffix holds the end-of-turn token the model must learn to emit, as in Hugging Face's
// assistant-only loss); the start text, every prefix and "after" text and every other role's
// message are prompt, never targets. Special tokens are written as their text ("<|eot_id|>"): the
// tokenizer turns them into their ids.
//
// Built in: "llama3" (Meta Llama 3 instruct, whose template trims each content's surrounding
// whitespace), "chatml" (Qwen and others: "<|im_end|>" trained, the newline after it not) and
// "none" (the contents as they are: prompt then completion, nothing added). Any other template is
// a JSON file, e.g. Llama 2 chat's turns (without its system prompt, which goes inside the first
// user turn):
//   {"trim": true,
//    "roles": {"user":      {"prefix": "<s>[INST] ", "suffix": " [/INST]"},
//              "assistant": {"prefix": " ", "suffix": " </s>"}}}
// "begin" and every prefix, suffix and after are optional (empty), "trim" too (false); "roles"
// must name "assistant".
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace dtrain {

struct ChatTurnFormat {
  std::string prefix;
  std::string suffix;
  std::string after;  // after the suffix, never trained
};

struct ChatTemplate {
  std::string name;                             // the built-in name or the file's path
  std::string begin;                            // once at the start of a sample
  std::map<std::string, ChatTurnFormat> roles;  // by role name; "assistant" is trained
  bool trim = false;  // each content without its leading and trailing whitespace
};

struct ChatMessage {
  std::string role;
  std::string content;
};

// A piece of a rendered sample and whether its tokens count in the loss.
struct TextSegment {
  std::string text;
  bool trained = false;
};

// The special-token markers the template writes ("<|eot_id|>", "<|im_start|>": text between
// "<|" and "|>"), each once, in order of first use. A tokenizer without them as special tokens
// encodes them as ordinary text.
std::vector<std::string> TemplateMarkers(const ChatTemplate& chat_template);

// A built-in template by name, or else a template file at that path. Errors: a name that is
// neither (naming the built-in ones), a file that is not valid JSON of the shape above (naming
// the file and the field).
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& name_or_path);

// The template as the JSON of a template file (every key written, and its "name"), which SFT
// shards record, and back: ParseTemplateJson's template is named `path`, as its errors are.
nlohmann::json TemplateJson(const ChatTemplate& chat_template);
absl::StatusOr<ChatTemplate> ParseTemplateJson(const nlohmann::json& json, const std::string& path);

// The template as a Jinja chat template of transformers' (tokenizer_config.json's chat_template):
// apply_chat_template renders a conversation as RenderConversation does, and with
// add_generation_prompt ends with the assistant's prefix.
std::string TemplateJinja(const ChatTemplate& chat_template);

// The segments of one conversation, in order. InvalidArgument for a role the template does not
// know (naming it and the template's roles), and for an assistant message without text, which
// would train its end-of-turn marker alone: a model taught to say nothing.
absl::StatusOr<std::vector<TextSegment>> RenderConversation(
    const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages);

}  // namespace dtrain
