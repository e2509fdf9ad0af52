#include "core/checkpoint/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(Crc32cTest, KnownVectors) {
  // The CRC-32C check value (RFC 3720 / the Castagnoli catalogue) and iSCSI test patterns.
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(0, "123456789", 9), 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF);
  EXPECT_EQ(Crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(0, ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(0, "", 0), 0u);
}

TEST(Crc32cTest, HardwareMatchesTableAtEveryLengthAndAlignment) {
  std::mt19937 random(7);
  std::vector<unsigned char> data(3 * 8192 * 2 + 1000);
  for (unsigned char& byte : data) byte = static_cast<unsigned char>(random());
  for (size_t length : {size_t{1}, size_t{7}, size_t{8}, size_t{255}, size_t{768}, size_t{769},
                        size_t{3 * 8192}, size_t{3 * 8192 + 771}, data.size() - 3}) {
    for (size_t offset = 0; offset < 3; ++offset) {
      EXPECT_EQ(Crc32c(0, data.data() + offset, length),
                Crc32cPortable(0, data.data() + offset, length))
          << "length " << length << " offset " << offset;
    }
  }
}

TEST(Crc32cTest, ContinuesAcrossPieces) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = Crc32c(0, text.data(), text.size());
  EXPECT_EQ(whole, 0x22620404u);
  EXPECT_EQ(Crc32c(Crc32c(0, text.data(), 10), text.data() + 10, text.size() - 10), whole);
}

}  // namespace
}  // namespace dtrain
