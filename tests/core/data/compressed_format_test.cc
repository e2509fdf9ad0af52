#include "core/data/compressed_format.h"

#include <optional>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

using namespace std::string_view_literals;

std::string NameOf(std::string_view head) {
  const std::optional<CompressedFormat> format = CompressedFormatOf(head);
  return format ? format->name : "";
}

TEST(CompressedFormatTest, NamesEachFormatByItsMagicBytes) {
  EXPECT_EQ(NameOf("\x1f\x8b\x08\x00"sv), "gzip");
  EXPECT_EQ(NameOf("\x28\xb5\x2f\xfd\x24"sv), "zstd");
  EXPECT_EQ(NameOf("\xfd"
                   "7zXZ\0\0"sv),
            "xz");
  EXPECT_EQ(NameOf("PK\x03\x04\x14"sv), "zip");
  // `printf x | bzip2` and an empty stream (`bzip2 < /dev/null`).
  EXPECT_EQ(NameOf("BZh91AY&SY\x8d\x6a"sv), "bzip2");
  EXPECT_EQ(NameOf("BZh9\x17\x72\x45\x38\x50\x90\0\0\0\0"sv), "bzip2");
  EXPECT_EQ(NameOf("hello"sv), "");
  EXPECT_EQ(NameOf(""sv), "");
}

// Text may begin with bzip2's first three bytes: only the block's magic after them makes it one
// (a text file that began "BZh" was refused as bzip2).
TEST(CompressedFormatTest, TextThatBeginsLikeBzip2IsText) {
  for (const std::string_view text :
       {"BZh"sv, "BZh9"sv, "BZh is a prefix"sv, "BZh91AY&SX"sv, "BZh01AY&SY"sv}) {
    EXPECT_EQ(NameOf(text), "") << text;
  }
}

}  // namespace
}  // namespace dtrain
