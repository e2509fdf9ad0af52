#include "core/util/byte_size.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

int64_t Bytes(absl::string_view text) { return ParseByteSize("--size", text).value_or(-1); }

TEST(ByteSizeTest, ReadsBinaryAndDecimalUnits) {
  EXPECT_EQ(Bytes("4096"), 4096);
  EXPECT_EQ(Bytes("100B"), 100);
  EXPECT_EQ(Bytes("64K"), 64 << 10);  // one letter: powers of 1024, as nccl-tests' -b and -e
  EXPECT_EQ(Bytes("64M"), 64 << 20);
  EXPECT_EQ(Bytes("1G"), int64_t{1} << 30);
  EXPECT_EQ(Bytes("4KiB"), 4096);
  EXPECT_EQ(Bytes("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(Bytes("8KB"), 8000);
  EXPECT_EQ(Bytes("256MB"), 256'000'000);
  EXPECT_EQ(Bytes(" 2gb "), 2'000'000'000);
  EXPECT_EQ(Bytes("1.9"), 1);  // whole bytes, rounded down
  EXPECT_EQ(Bytes("1TB"), 1'000'000'000'000);
  EXPECT_EQ(Bytes("1TiB"), int64_t{1} << 40);
  EXPECT_EQ(Bytes("2T"), int64_t{1} << 41);
}

TEST(ByteSizeTest, RefusesWhatIsNoSizeNamingTheOption) {
  for (const char* bad :
       {"", "MB", "-1M", "1X", "1 M B", "inf", "nan", "1e30G", "9999999999999G", "0x10K"}) {
    const absl::StatusOr<int64_t> size = ParseByteSize("--shard-size", bad);
    ASSERT_FALSE(size.ok()) << bad << " read as " << *size;
    EXPECT_THAT(size.status().message(),
                HasSubstr(absl::StrCat("--shard-size '", bad, "' is not a byte size; write e.g.")));
  }
  EXPECT_EQ(Bytes("4194304G"), int64_t{1} << 52);  // large, but in range
  for (const char* small : {"0", "0.5", "0K"}) {
    EXPECT_THAT(ParseByteSize("--shard-size", small).status().message(),
                HasSubstr(absl::StrCat("--shard-size '", small,
                                       "' is less than a byte; give at "
                                       "least 1")));
    // With a minimum, what is below it, a byte or less included, is refused naming it.
    EXPECT_THAT(ParseByteSize("--shard-size", small, 4096).status().message(),
                HasSubstr(absl::StrCat("--shard-size '", small,
                                       "' is less than 4096 bytes; give at least 4096")));
  }
  EXPECT_FALSE(ParseByteSize("--shard-size", "4095", 4096).ok());
  EXPECT_EQ(ParseByteSize("--shard-size", "4K", 4096).value_or(0), 4096);
}

}  // namespace
}  // namespace dtrain
