#include "core/checkpoint/format.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// A save must not throw: text that is not UTF-8 (a recipe read from "r\xff.yaml" names its file
// in the resolved recipe's first line) is written with U+FFFD, and the manifest reads back.
TEST(CheckpointFormatTest, ManifestWithBytesThatAreNotUtf8IsWrittenAndReadsBack) {
  Manifest m;
  m.dtrain_version = "test";
  m.step = 4;
  m.recipe_yaml = "# Resolved recipe from r\xff.yaml\nrun:\n  seed: 1\n";
  m.tensors = {{"a", {2}, 2}};
  std::string text;
  ASSERT_NO_THROW(text = ManifestToJson(m));
  absl::StatusOr<Manifest> back = ManifestFromJson(text, "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 4);
  EXPECT_EQ(back->recipe_yaml, "# Resolved recipe from r\xef\xbf\xbd.yaml\nrun:\n  seed: 1\n");

  RankIndex index;
  index.file = "rank-0.bin";
  index.data.cursor = std::string(1, 'x') + '\xfe';
  ASSERT_NO_THROW(text = RankIndexToJson(index));
  EXPECT_THAT(text, HasSubstr("x\xef\xbf\xbd"));
}

}  // namespace
}  // namespace dtrain
