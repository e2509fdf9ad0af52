#include "core/data/tar_reader.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/core/data/tar_test_util.h"

namespace dtrain {
namespace {

using testing::TarArchive;

// Every regular member as (name, data), or the error.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadAll(std::string tar) {
  std::unique_ptr<ByteSource> source = MemorySource(std::move(tar), "mem.tar");
  TarReader reader(source.get());
  std::vector<std::pair<std::string, std::string>> members;
  TarMember member;
  while (true) {
    absl::StatusOr<bool> more = reader.Next(&member);
    if (!more.ok()) return more.status();
    if (!*more) return members;
    members.emplace_back(member.name, member.data);
  }
}

std::string FileBytes(const testing::TempDir& dir, const std::string& kind,
                      const std::string& members) {
  const std::string out = dir / (kind + ".tar");
  EXPECT_TRUE(testing::RunPython(testing::TestScript("make_shards.py") + " " + kind + " " + out +
                                 " " + members));
  return testing::ReadFile(out);
}

TEST(TarReaderTest, ReadsPythonPaxArchives) {
  testing::TempDir dir;
  const std::string long_name = "d/" + std::string(150, 'p') + ".txt";
  auto members = ReadAll(FileBytes(dir, "pax", "a.txt=hello b.json=[1] " + long_name + "=long"));
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 3u);
  EXPECT_EQ((*members)[0], std::make_pair(std::string("a.txt"), std::string("hello")));
  EXPECT_EQ((*members)[1].second, "[1]");
  EXPECT_EQ((*members)[2].first, long_name);
  EXPECT_EQ((*members)[2].second, "long");
}

TEST(TarReaderTest, ReadsGnuTarLongNames) {
  testing::TempDir dir;
  const std::string long_name = std::string(120, 'g') + "/" + std::string(110, 'n') + ".txt";
  auto members = ReadAll(FileBytes(dir, "gnu", "short.txt=x " + long_name + "=gnu-long"));
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].first, "short.txt");
  EXPECT_EQ((*members)[1].first, long_name);
  EXPECT_EQ((*members)[1].second, "gnu-long");
}

TEST(TarReaderTest, ReadsUstarPrefixes) {
  testing::TempDir dir;
  const std::string path = std::string(90, 'u') + "/" + std::string(40, 'v') + ".txt";
  auto members = ReadAll(FileBytes(dir, "ustar", path + "=prefixed"));
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].first, path);
}

TEST(TarReaderTest, ReadsBase256SizesAndSkipsNonRegularEntries) {
  std::string tar = TarHeader("dir/", 0, '5');
  tar += TarArchive({{"dir/x.txt", std::string(700, 'z')}}, TarSizeField::kBase256);
  auto members = ReadAll(tar);
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].second, std::string(700, 'z'));
}

TEST(TarReaderTest, ReportsShortDataWithOffset) {
  std::string tar = TarArchive({{"a.txt", "aaa"}, {"b.txt", std::string(2000, 'b')}});
  tar.resize(512 + 512 + 512 + 1000);  // inside b.txt's data
  auto members = ReadAll(tar);
  ASSERT_FALSE(members.ok());
  EXPECT_TRUE(absl::StrContains(members.status().message(), "mem.tar")) << members.status();
  EXPECT_TRUE(absl::StrContains(members.status().message(), "'b.txt' (header at byte 1024)"))
      << members.status();
  EXPECT_TRUE(absl::StrContains(members.status().message(), "after 1000 of them"));
}

TEST(TarReaderTest, DetectsAnArchiveCutExactlyBetweenMembers) {
  std::string tar = TarArchive({{"a.txt", "aaa"}, {"b.txt", "bbb"}});
  tar.resize(2048);  // both members whole, no end blocks
  auto members = ReadAll(tar);
  ASSERT_FALSE(members.ok());
  EXPECT_TRUE(absl::StrContains(members.status().message(), "byte 2048")) << members.status();
  EXPECT_TRUE(absl::StrContains(members.status().message(), "cut")) << members.status();

  tar = TarArchive({{"a.txt", "aaa"}});
  tar.resize(tar.size() - 512);  // one of the two end blocks
  EXPECT_FALSE(ReadAll(tar).ok());
}

// Fewer bytes than one header, from the start (a shard command that printed a line): no tar
// archive at all, not a cut one; a header cut later is a cut archive.
TEST(TarReaderTest, ShortOfAFirstHeaderIsNoArchive) {
  auto garbage = ReadAll("garbage\n");
  ASSERT_FALSE(garbage.ok());
  EXPECT_TRUE(absl::StrContains(garbage.status().message(),
                                "the shard holds 8 bytes, less than a tar header's 512: it is no "
                                "tar archive"))
      << garbage.status();
  std::string tar = TarArchive({{"a.txt", "aaa"}, {"b.txt", "bbb"}});
  tar.resize(1024 + 100);  // inside b.txt's header
  auto cut = ReadAll(tar);
  ASSERT_FALSE(cut.ok());
  EXPECT_TRUE(absl::StrContains(cut.status().message(),
                                "the archive ends inside a 512-byte header (100 bytes)"))
      << cut.status();
}

TEST(TarReaderTest, RejectsACorruptHeaderChecksum) {
  std::string tar = TarArchive({{"a.txt", "aaa"}, {"b.txt", "bbb"}});
  tar[1024 + 10] ^= 0x20;  // a letter of b.txt's name
  auto members = ReadAll(tar);
  ASSERT_FALSE(members.ok());
  EXPECT_TRUE(absl::StrContains(members.status().message(), "byte 1024: header checksum"))
      << members.status();
}

// A compressed shard (WebDataset's .tar.gz) is named as such, with the command that reads it:
// it was "corrupt or not a tar file".
TEST(TarReaderTest, ACompressedShardSaysHowToReadIt) {
  std::string gzip = std::string("\x1f\x8b\x08\x00", 4) + std::string(1020, 'x');
  auto members = ReadAll(gzip);
  ASSERT_FALSE(members.ok());
  EXPECT_TRUE(absl::StrContains(members.status().message(),
                                "shard mem.tar, byte 0: the shard is gzip-compressed, and dtrain "
                                "reads plain tar: unpack it, or read it as pipe:gunzip -c mem.tar"))
      << members.status();
}

// Members of every size around the 16 KiB read-ahead and the 2 KiB read behind large members,
// read from a file (readv) and from memory, byte for byte, with the offset at the file's end.
TEST(TarReaderTest, ReadsMembersOfEverySizeFromFilesAndMemory) {
  std::vector<std::pair<std::string, std::string>> members;
  const int64_t sizes[] = {100000, 5, 16384, 16383, 16385, 0, 2048, 70000, 511, 100000, 1};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    std::string data(static_cast<size_t>(sizes[i]), '\0');
    for (size_t j = 0; j < data.size(); ++j) data[j] = static_cast<char>((i * 131 + j * 7) % 251);
    members.emplace_back(absl::StrCat("m", i, ".bin"), std::move(data));
  }
  const std::string tar = TarArchive(members) + std::string(10240, '\0');  // writers' padding
  testing::TempDir dir;
  const std::string path = dir / "sizes.tar";
  testing::WriteFile(path, tar);
  for (const std::string& url : {path, std::string("memory")}) {
    absl::StatusOr<std::unique_ptr<ByteSource>> source =
        url == "memory" ? absl::StatusOr<std::unique_ptr<ByteSource>>(MemorySource(tar, "mem.tar"))
                        : OpenShard(url, ShardSourceOptions{});
    ASSERT_TRUE(source.ok()) << source.status();
    TarReader reader(source->get());
    TarMember member;
    for (const auto& [name, data] : members) {
      absl::StatusOr<bool> more = reader.Next(&member);
      ASSERT_TRUE(more.ok() && *more) << url << " " << name << " " << more.status();
      EXPECT_EQ(member.name, name);
      EXPECT_TRUE(member.data == data) << url << " " << name;
    }
    absl::StatusOr<bool> more = reader.Next(&member);
    ASSERT_TRUE(more.ok() && !*more) << url << " " << more.status();
    EXPECT_EQ(reader.offset(), static_cast<int64_t>(tar.size())) << url;
  }
}

// What follows the end blocks is drained (a pipe's writer finishes, an HTTP body is read to its
// end), up to 16 MiB: a source that goes on (/dev/zero, which reads as end blocks) is no archive.
TEST(TarReaderTest, DrainsPaddingButNotASourceThatNeverEnds) {
  std::unique_ptr<ByteSource> padded =
      MemorySource(TarArchive({{"a.txt", "aaa"}}) + std::string(1 << 20, '\0'), "padded.tar");
  TarReader padded_reader(padded.get());
  TarMember member;
  ASSERT_TRUE(padded_reader.Next(&member).value());
  EXPECT_FALSE(padded_reader.Next(&member).value());

  absl::StatusOr<std::unique_ptr<ByteSource>> zeros = OpenShard("/dev/zero", ShardSourceOptions{});
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  TarReader reader(zeros->get());
  const absl::StatusOr<bool> more = reader.Next(&member);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(
      more.status().message(),
      "shard /dev/zero, byte 1024: more than 16 MiB follow the archive's end blocks, which a tar "
      "writer pads to a record: this is not one archive");
}

TEST(TarReaderTest, ReportsAFileCutInsideALargeMember) {
  std::string tar = TarArchive({{"a.bin", std::string(100000, 'a')}, {"b.bin", "b"}});
  tar.resize(512 + 60000);
  testing::TempDir dir;
  const std::string path = dir / "cut.tar";
  testing::WriteFile(path, tar);
  absl::StatusOr<std::unique_ptr<ByteSource>> source = OpenShard(path, ShardSourceOptions{});
  ASSERT_TRUE(source.ok()) << source.status();
  TarReader reader(source->get());
  TarMember member;
  absl::StatusOr<bool> more = reader.Next(&member);
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(absl::StrContains(more.status().message(), "'a.bin' (header at byte 0)"))
      << more.status();
  EXPECT_TRUE(absl::StrContains(more.status().message(), "after 60000 of them")) << more.status();
}

TEST(TarReaderTest, RejectsSizesAboveTheLimit) {
  std::string tar = TarHeader("big.bin", int64_t{1} << 40) + TarEnd();  // too big for octal
  std::unique_ptr<ByteSource> source = MemorySource(tar, "big.tar");
  TarReader reader(source.get(), /*max_member_bytes=*/1 << 20);
  TarMember member;
  absl::StatusOr<bool> more = reader.Next(&member);
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(absl::StrContains(more.status().message(), "limit")) << more.status();
}

}  // namespace
}  // namespace dtrain
