// README.md carries the recipe reference; it must be what `dtrain recipe reference` prints.
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

TEST(ReadmeTest, RecipeReferenceIsCurrent) {
  std::ifstream in(absl::StrCat(DTRAIN_SOURCE_DIR, "/README.md"));
  const std::string readme(std::istreambuf_iterator<char>(in), {});
  const std::string begin = "<!-- recipe reference begin -->\n";
  const size_t start = readme.find(begin);
  const size_t stop = readme.find("<!-- recipe reference end -->");
  ASSERT_NE(start, std::string::npos);
  ASSERT_NE(stop, std::string::npos);
  const std::string in_readme = readme.substr(start + begin.size(), stop - start - begin.size());
  const testing::Outcome printed = testing::RunDtrain("recipe reference");
  ASSERT_EQ(printed.exit_code, 0);
  EXPECT_EQ(in_readme, printed.stdout_text) << "run scripts/update_readme.sh";
}

}  // namespace
}  // namespace dtrain
