#include "core/util/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

constexpr size_t kValid = absl::string_view::npos;

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_EQ(FirstInvalidUtf8Byte(""), kValid);
  EXPECT_EQ(FirstInvalidUtf8Byte("small"), kValid);
  EXPECT_EQ(FirstInvalidUtf8Byte("gr\xc3\xb6\xc3\x9f"
                                 "e \xe2\x82\xac \xf0\x9f\x98\x80"),
            kValid);
  EXPECT_EQ(FirstInvalidUtf8Byte("\xf4\x8f\xbf\xbf"), kValid);  // U+10FFFF, the last code point
}

TEST(Utf8Test, FindsFirstBadByte) {
  EXPECT_EQ(FirstInvalidUtf8Byte("sm\xff"
                                 "all"),
            2u);
  EXPECT_EQ(FirstInvalidUtf8Byte("ab\xc3"), 2u);  // truncated sequence
  EXPECT_EQ(FirstInvalidUtf8Byte("\xc3"
                                 "a"),
            0u);                                            // lead without continuation
  EXPECT_EQ(FirstInvalidUtf8Byte("\x80"), 0u);              // stray continuation
  EXPECT_EQ(FirstInvalidUtf8Byte("\xc0\xaf"), 0u);          // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8Byte("\xe0\x80\xaf"), 0u);      // overlong, three bytes
  EXPECT_EQ(FirstInvalidUtf8Byte("x\xed\xa0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(FirstInvalidUtf8Byte("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
}

TEST(Utf8Test, DescribesAndEscapes) {
  EXPECT_EQ(DescribeInvalidUtf8("small"), "");
  EXPECT_EQ(DescribeInvalidUtf8("sm\xff"
                                "all"),
            "byte 3 (0xff) is not valid UTF-8");
  EXPECT_EQ(EscapeInvalidUtf8("sm\xff"
                              "all \xc3\xb6"),
            "sm\\xffall \xc3\xb6");
}

}  // namespace
}  // namespace dtrain
