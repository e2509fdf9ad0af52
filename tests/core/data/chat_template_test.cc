#include "core/data/chat_template.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

std::string Rendered(const std::vector<TextSegment>& segments, bool trained_only) {
  std::string text;
  for (const TextSegment& s : segments) {
    if (!trained_only || s.trained) text += s.text;
  }
  return text;
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi?"}, {"assistant", "Hello."}};

// The texts of Hugging Face's chat templates for these models (apply_chat_template without a
// generation prompt), with only the assistant's content and end-of-turn marker trained. Llama 3's
// template trims each content ("message['content'] | trim"); ChatML's does not.
TEST(ChatTemplateTest, MarkersAreTheSpecialTokensTheTemplateWrites) {
  EXPECT_EQ(TemplateMarkers(*LoadChatTemplate("chatml")),
            (std::vector<std::string>{"<|im_start|>", "<|im_end|>"}));
  const std::vector<std::string> llama3 = TemplateMarkers(*LoadChatTemplate("llama3"));
  EXPECT_EQ(llama3.front(), "<|begin_of_text|>");
  EXPECT_EQ(llama3.size(), 4u);  // and <|start_header_id|>, <|end_header_id|>, <|eot_id|>
  EXPECT_TRUE(TemplateMarkers(*LoadChatTemplate("none")).empty());
}

TEST(ChatTemplateTest, Llama3AndChatMlRenderAsTheirModelsExpect) {
  absl::StatusOr<ChatTemplate> llama3 = LoadChatTemplate("llama3");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  absl::StatusOr<std::vector<TextSegment>> segments = RenderConversation(*llama3, kConversation);
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_EQ(Rendered(*segments, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>");
  EXPECT_EQ(Rendered(*segments, true), "Hello.<|eot_id|>");
  segments = RenderConversation(*llama3, {{"user", " Hi? \n"}, {"assistant", "\tHello.\n"}});
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_EQ(Rendered(*segments, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>");
  // Trimmed as Jinja's `trim` (Python's str.strip()) trims, Unicode spaces and U+001C..U+001F
  // included (ASCII whitespace alone was stripped); a zero-width space is no space. The
  // expectations are jinja2's renderings of "{{ x | trim }}".
  segments = RenderConversation(*llama3, {{"user", "\u00a0Hi?\u3000"},
                                          {"assistant", "\x1c\u2003H\u00e9llo\u205f\u0085"},
                                          {"user", "\u200bHi\u200b"},
                                          {"assistant", "\u00e9"}});
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_EQ(Rendered(*segments, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nH\u00e9llo<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n\u200bHi\u200b<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n\u00e9<|eot_id|>");
  // An answer of whitespace alone is no answer.
  EXPECT_THAT(
      RenderConversation(*llama3, {{"user", "Hi?"}, {"assistant", " \n"}}).status().message(),
      ::testing::HasSubstr("message 2 of 2 (the assistant's) has no text"));

  absl::StatusOr<ChatTemplate> chatml = LoadChatTemplate("chatml");
  ASSERT_TRUE(chatml.ok()) << chatml.status();
  segments = RenderConversation(*chatml, kConversation);
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_EQ(Rendered(*segments, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
  EXPECT_EQ(Rendered(*segments, true), "Hello.<|im_end|>");  // not the newline after it
  segments = RenderConversation(*chatml, {{"user", " Hi? "}, {"assistant", " Hello. "}});
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_EQ(Rendered(*segments, true), " Hello. <|im_end|>");
}

// Llama 2 chat's turns as a file (README's example): "after" text is never trained, "trim" strips
// each content.
TEST(ChatTemplateTest, TemplateFileTakesAfterAndTrim) {
  const std::string path = ::testing::TempDir() + "/llama2_template.json";
  std::ofstream(path) << R"({"trim": true, "roles": {
      "user": {"prefix": "<s>[INST] ", "suffix": " [/INST]"},
      "assistant": {"prefix": " ", "suffix": " </s>", "after": "\n"}}})";
  absl::StatusOr<ChatTemplate> loaded = LoadChatTemplate(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<std::vector<TextSegment>> segments = RenderConversation(
      *loaded, {{"user", "Hi? "}, {"assistant", " 4"}, {"user", "And?"}, {"assistant", "5"}});
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_EQ(Rendered(*segments, false),
            "<s>[INST] Hi? [/INST] 4 </s>\n<s>[INST] And? [/INST] 5 </s>\n");
  EXPECT_EQ(Rendered(*segments, true), "4 </s>5 </s>");
  std::ofstream(path) << R"({"trim": "yes", "roles": {"assistant": {}}})";
  EXPECT_THAT(LoadChatTemplate(path).status().message(),
              ::testing::HasSubstr("\"trim\" is not true or false"));
}

TEST(ChatTemplateTest, TemplateFileDefinesBeginAndRoles) {
  const std::string path = ::testing::TempDir() + "/mistral_template.json";
  std::ofstream(path) << R"({"begin": "<s>", "roles": {
      "user": {"prefix": "[INST] ", "suffix": " [/INST]"},
      "assistant": {"suffix": "</s>"}}})";
  absl::StatusOr<ChatTemplate> loaded = LoadChatTemplate(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<std::vector<TextSegment>> segments =
      RenderConversation(*loaded, {{"user", "Hi?"}, {"assistant", "Hello."}});
  ASSERT_TRUE(segments.ok()) << segments.status();
  EXPECT_EQ(Rendered(*segments, false), "<s>[INST] Hi? [/INST]Hello.</s>");
  EXPECT_EQ(Rendered(*segments, true), "Hello.</s>");
  // A role the template lacks is an error naming it and the roles there are.
  segments = RenderConversation(*loaded, {{"system", "x"}});
  EXPECT_EQ(segments.status().message(),
            "role \"system\" is not one of " + path + "'s roles (assistant, user)");
}

// SFT shards record their template as JSON, and an export reads it back (then writes it as Jinja,
// which tests/reference/sft_chain.py renders with transformers against the packed ids).
TEST(ChatTemplateTest, TheJsonRecordReadsBackAsTheTemplate) {
  for (const char* name : {"llama3", "chatml", "none"}) {
    const ChatTemplate chat_template = *LoadChatTemplate(name);
    absl::StatusOr<ChatTemplate> back = ParseTemplateJson(TemplateJson(chat_template), "record");
    ASSERT_TRUE(back.ok()) << back.status();
    const std::vector<ChatMessage> turns = {{"user", " Hi? "}, {"assistant", "Hello."}};
    EXPECT_EQ(Rendered(*RenderConversation(*back, turns), false),
              Rendered(*RenderConversation(chat_template, turns), false))
        << name;
    EXPECT_EQ(Rendered(*RenderConversation(*back, turns), true),
              Rendered(*RenderConversation(chat_template, turns), true))
        << name;
  }
  EXPECT_THAT(
      TemplateJinja(*LoadChatTemplate("chatml")),
      ::testing::HasSubstr("{% if add_generation_prompt %}{{ \"<|im_start|>assistant\\n\" }}"));
}

TEST(ChatTemplateTest, UnknownNamesAndBadFilesAreErrorsNamingThem) {
  EXPECT_EQ(LoadChatTemplate("llama9").status().message(),
            "chat template 'llama9' is neither a built-in one (llama3, chatml, none) nor a "
            "readable file");
  const std::string dir = ::testing::TempDir();
  for (const auto& [text, what] :
       {std::pair{"{not json", "not valid JSON (byte 3); a template file is JSON, not Jinja"},
        {"{% for m in messages %}{{ m.content }}{% endfor %}", "not valid JSON (byte 2)"},
        {"[]", "not a JSON object"},
        // A typo is not a template without the key: "sufix" would train no end of turn.
        {R"({"roles": {"assistant": {"prefix": "A:", "sufix": "<|eot_id|>"}}})",
         "unknown key \"sufix\" in roles.assistant (the keys are prefix, suffix, after)"},
        {R"({"rolez": {"assistant": {}}})",
         "unknown key \"rolez\" (the keys are name, begin, trim, roles)"},
        {R"({"begin": 3, "roles": {}})", "\"begin\" is not a string"},
        {R"({"roles": {"user": {}}})", "roles has no \"assistant\""},
        {R"({"roles": {"assistant": {"suffix": []}}})", "roles.assistant.suffix is not a string"},
        {R"({"begin": ""})", "no \"roles\" object"},
        {R"({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})",
         "a Jinja chat_template"}}) {
    const std::string path = dir + "/bad_template.json";
    std::ofstream(path) << text;
    const absl::Status status = LoadChatTemplate(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(status.message().find("chat template " + path + ": " + what), std::string::npos)
        << status.message();
  }
  // A folder is refused as one, where reading it ended the process.
  EXPECT_EQ(LoadChatTemplate(dir).status().message(),
            "chat template: " + dir + " is a folder, not a file");
}

}  // namespace
}  // namespace dtrain
