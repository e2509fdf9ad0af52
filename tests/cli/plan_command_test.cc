// `dtrain plan` as a user runs it: its recipe lines are a recipe.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

// The "Recipe lines:" block of a plan's text as --set overrides: "section:" lines open a
// section, "  key: value" lines set a key in it, comments are skipped.
std::string RecipeLinesAsOverrides(const std::string& plan_text) {
  const size_t begin = plan_text.find("\nRecipe lines:\n");
  const size_t end = plan_text.find("\nsbatch lines:\n");
  EXPECT_NE(begin, std::string::npos) << plan_text;
  EXPECT_NE(end, std::string::npos) << plan_text;
  if (begin == std::string::npos || end == std::string::npos) return "";
  const std::string block = plan_text.substr(begin + 15, end - begin - 15);
  std::string section, overrides;
  for (absl::string_view line : absl::StrSplit(block, '\n', absl::SkipEmpty())) {
    const absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(line);
    if (absl::StartsWith(trimmed, "#")) continue;
    const std::vector<std::string> parts = absl::StrSplit(trimmed, absl::MaxSplits(": ", 1));
    if (trimmed == line) {  // a section
      EXPECT_TRUE(absl::EndsWith(line, ":")) << line;
      section = std::string(absl::StripSuffix(line, ":"));
      continue;
    }
    EXPECT_EQ(parts.size(), 2u) << line;
    if (parts.size() != 2) continue;
    absl::StrAppend(&overrides, " --set ", section, ".", parts[0], "=", parts[1]);
  }
  return overrides;
}

// Every shipped config's plan prints recipe lines that `dtrain recipe check` accepts when
// applied to that config.
TEST(PlanCommandTest, RecipeLinesOfEveryShippedConfigAreAValidRecipe) {
  int configs = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(DTRAIN_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++configs;
    const std::string path = entry.path().string();
    SCOPED_TRACE(path);
    const testing::Outcome plan = testing::RunDtrain(absl::StrCat("plan ", path));
    ASSERT_EQ(plan.exit_code, 0) << plan.stderr_text;
    const std::string overrides = RecipeLinesAsOverrides(plan.stdout_text);
    ASSERT_NE(overrides.find("--set parallel.strategy="), std::string::npos) << overrides;
    const testing::Outcome check =
        testing::RunDtrain(absl::StrCat("recipe check ", path, overrides));
    EXPECT_EQ(check.exit_code, 0) << overrides << "\n" << check.stderr_text;
  }
  EXPECT_GE(configs, 9);
}

// The assumptions line names the recipe's pipeline schedule, the one the trainer runs.
TEST(PlanCommandTest, AssumptionsNameTheRecipesPipelineSchedule) {
  for (const char* schedule : {"1f1b", "gpipe"}) {
    SCOPED_TRACE(schedule);
    const testing::Outcome plan =
        testing::RunDtrain(absl::StrCat("plan ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set ",
                                        "parallel.pp_schedule=", schedule));
    ASSERT_EQ(plan.exit_code, 0) << plan.stderr_text;
    EXPECT_TRUE(
        absl::StrContains(plan.stdout_text, absl::StrCat(", ", schedule, " pipeline schedule, ")))
        << plan.stdout_text;
  }
}

}  // namespace
}  // namespace dtrain
