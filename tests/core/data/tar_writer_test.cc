#include "core/data/tar_writer.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/data/shard_source.h"
#include "core/data/tar_reader.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using Members = std::vector<std::pair<std::string, std::string>>;

// Directory, regular members of sizes around the block and a name that fills the whole 100-byte
// field (no terminating NUL): TarReader reads the regular ones back whole, checksums verified.
TEST(TarWriterTest, ArchivesReadBackInBothSizeForms) {
  const Members members = {{"dir/empty.txt", ""},
                           {"dir/one.bin", "x"},
                           {"dir/block.bin", std::string(512, 'b')},
                           {std::string(96, 'n') + ".txt", std::string(1000, 'c')}};
  for (const TarSizeField size_field : {TarSizeField::kOctalWhereItFits, TarSizeField::kBase256}) {
    std::string tar = TarHeader("dir/", 0, '5', size_field);
    for (const auto& [name, data] : members) {
      const int64_t size = static_cast<int64_t>(data.size());
      tar += TarHeader(name, size, '0', size_field) + data + TarPadding(size);
    }
    tar += TarEnd();
    EXPECT_EQ(tar.size() % 512, 0u);
    std::unique_ptr<ByteSource> source = MemorySource(tar, "written.tar");
    TarReader reader(source.get());
    Members read;
    TarMember member;
    absl::StatusOr<bool> more;
    while ((more = reader.Next(&member)).ok() && *more) read.emplace_back(member.name, member.data);
    ASSERT_TRUE(more.ok()) << more.status();
    EXPECT_EQ(read, members);
  }
}

// 11 octal digits hold sizes below 8 GiB; from 8 GiB on the size is written in base-256.
TEST(TarWriterTest, SizesFromEightGibOnAreWrittenInBase256) {
  const int64_t largest_octal = (int64_t{1} << 33) - 1;
  EXPECT_EQ(TarHeader("a", largest_octal).substr(124, 12), std::string("77777777777\0", 12));
  const std::string big = TarHeader("a", largest_octal + 1);
  EXPECT_EQ(static_cast<unsigned char>(big[124]), 0x80);
  // 2^33 big-endian in the field's last 8 bytes.
  EXPECT_EQ(big.substr(125, 11), std::string("\0\0\0\0\0\0\x02\0\0\0\0", 11));
}

TEST(TarWriterTest, PaddingFillsTheLastBlockOnly) {
  EXPECT_EQ(TarPadding(0), "");
  EXPECT_EQ(TarPadding(1), std::string(511, '\0'));
  EXPECT_EQ(TarPadding(512), "");
  EXPECT_EQ(TarPadding(1000), std::string(24, '\0'));
  EXPECT_EQ(TarEnd(), std::string(1024, '\0'));
}

}  // namespace
}  // namespace dtrain
