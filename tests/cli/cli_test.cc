// Runs the dtrain binary: exit codes and what goes to stdout for the recipe commands.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  int exit_code = -1;
  std::string stdout_text;
  std::string stderr_text;
};

// Runs `dtrain <args>` through the shell, capturing both streams.
Outcome RunDtrain(const std::string& args) {
  const std::string err_path = absl::StrCat(::testing::TempDir(), "/dtrain_cli_stderr.txt");
  const std::string command = absl::StrCat(DTRAIN_BINARY, " ", args, " 2>", err_path);
  Outcome outcome;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
    outcome.stdout_text.append(buffer, n);
  }
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  outcome.stderr_text.assign(std::istreambuf_iterator<char>(err), {});
  return outcome;
}

std::string WriteRecipe(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST(CliTest, RecipeCheckOnBadRecipeExits2) {
  const std::string path = WriteRecipe("bad.yaml", "data:\n  train: [x]\ntrain:\n  lrr: 1\n");
  const Outcome outcome = RunDtrain(absl::StrCat("recipe check ", path));
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("did you mean train.lr?"));
  EXPECT_EQ(outcome.stdout_text, "");
}

TEST(CliTest, RecipeCheckPrintsResolvedRecipe) {
  const Outcome outcome = RunDtrain(
      absl::StrCat("recipe check ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set train.steps=70"));
  EXPECT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
  EXPECT_THAT(outcome.stdout_text, HasSubstr("  steps: 70"));
  EXPECT_THAT(outcome.stdout_text, HasSubstr("  name: tiny"));
}

TEST(CliTest, RecipeCheckBadOverrideExits2) {
  const Outcome outcome = RunDtrain(
      absl::StrCat("recipe check ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set train.lr=abc"));
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("--set train.lr=abc: expected a number"));
}

TEST(CliTest, TrainWithBadRecipeExits2BeforeRunning) {
  const Outcome outcome = RunDtrain("train --set parallel.tp=2");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("tensor parallel"));
  const Outcome missing = RunDtrain("train /nonexistent/recipe.yaml");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.stderr_text, HasSubstr("/nonexistent/recipe.yaml"));
}

TEST(CliTest, RecipeReferencePrintsTable) {
  const Outcome outcome = RunDtrain("recipe reference");
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_THAT(outcome.stdout_text, HasSubstr("| `train.lr` |"));
}

TEST(CliTest, VersionAndHelp) {
  const Outcome version = RunDtrain("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.stdout_text, absl::StrCat("dtrain ", DTRAIN_VERSION, "\n"));

  for (const char* args : {"help", "--help"}) {
    const Outcome help = RunDtrain(args);
    EXPECT_EQ(help.exit_code, 0) << args;
    EXPECT_THAT(help.stdout_text, HasSubstr("train")) << args;
    EXPECT_THAT(help.stdout_text, HasSubstr("recipe")) << args;
  }
  const Outcome none = RunDtrain("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.stderr_text, HasSubstr("train"));
  EXPECT_EQ(RunDtrain("no-such-command").exit_code, 2);
}

}  // namespace
}  // namespace dtrain
