#include "core/data/token_decode.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

Sample OneField(const std::string& extension, const std::string& data) {
  Sample sample{.key = "k", .url = "s.tar"};
  sample.fields.push_back({.extension = extension, .data = data, .member = "k." + extension});
  return sample;
}

TEST(TokenDecodeTest, DecodesEveryFormat) {
  std::vector<int32_t> tokens;
  ASSERT_TRUE(
      DecodeSampleTokens(OneField("tokens", std::string("\x01\x02\xff\x00", 4)), 1 << 16, &tokens)
          .ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{0x0201, 0xff}));
  ASSERT_TRUE(
      DecodeSampleTokens(OneField("tokens32", std::string("\x01\x00\x01\x00", 4)), 1 << 20, &tokens)
          .ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{0x10001}));
  ASSERT_TRUE(DecodeSampleTokens(OneField("json", "[5, 0, 7]"), 8, &tokens).ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{5, 0, 7}));
  ASSERT_TRUE(DecodeSampleTokens(OneField("txt", "hi\xff"), 256, &tokens).ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{'h', 'i', 255}));
}

TEST(TokenDecodeTest, ErrorsNameTheSampleAndTheProblem) {
  std::vector<int32_t> tokens;
  absl::Status status = DecodeSampleTokens(OneField("tokens", "abc"), 1 << 16, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "sample 'k'")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "3 bytes")) << status;
  status = DecodeSampleTokens(OneField("txt", "ab"), 98, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "token 1 is 98")) << status;
  status = DecodeSampleTokens(OneField("json", "{\"a\": 1}"), 10, &tokens);
  EXPECT_FALSE(status.ok());
  status = DecodeSampleTokens(OneField("json", "[1, -2]"), 10, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "item 1 is -2")) << status;
  status = DecodeSampleTokens(OneField("png", "x"), 10, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "no token field among its files (.png)"))
      << status;
}

}  // namespace
}  // namespace dtrain
