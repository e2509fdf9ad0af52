#include "core/checkpoint/reader.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/checkpoint/checkpoint_test_util.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

void FlipByte(const std::string& path, std::streamoff offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(offset);
  char byte = 0;
  file.read(&byte, 1);
  byte ^= 0x40;
  file.seekp(offset);
  file.write(&byte, 1);
}

TEST(CheckpointReaderTest, AFlippedByteIsNamedByChunkAndFile) {
  const std::string dir = testing::FreshDir("ckpt_flip");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  FlipByte(dir + "/step-2/rank-1.bin", 5);
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  ASSERT_TRUE(reader.ok());  // sizes still agree; the checksum finds it
  std::vector<float> out(10);
  const absl::Status status = reader->Read("a", 0, 10, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("chunk a[5:10) in rank-1.bin at byte 0"));
  EXPECT_THAT(status.message(), HasSubstr("checksum"));
  const std::vector<std::string> problems = reader->VerifyAll();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], HasSubstr("rank-1.bin"));
  // Reading only rank 0's chunk still works: a rank that does not need the bad chunk is fine.
  EXPECT_TRUE(reader->Read("a", 0, 5, out.data()).ok());
}

TEST(CheckpointReaderTest, ATruncatedRankFileIsNamed) {
  const std::string dir = testing::FreshDir("ckpt_trunc");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  fs::resize_file(dir + "/step-2/rank-0.bin", 12);
  const absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  ASSERT_FALSE(reader.ok());
  EXPECT_THAT(reader.status().message(), HasSubstr("rank-0.bin holds 12 bytes"));
  EXPECT_THAT(reader.status().message(), HasSubstr("truncated"));
}

TEST(CheckpointReaderTest, AMissingManifestMeansAnIncompleteSave) {
  const std::string dir = testing::FreshDir("ckpt_nomanifest");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  fs::remove(dir + "/step-2/manifest.json");
  const absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr("did not complete"));
}

TEST(CheckpointReaderTest, ADamagedManifestIsRejected) {
  const std::string dir = testing::FreshDir("ckpt_badmanifest");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  std::ofstream(dir + "/step-2/manifest.json") << "{\"format\": \"dtrain-checkpoint\"";
  const absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("manifest.json"));
}

TEST(CheckpointReaderTest, ManifestRoundTripsThroughJson) {
  Manifest m = testing::BaseManifest();
  m.step = 9;
  m.world = WorldRecord{4, "zero3", 4, 1, 1};
  m.chunks = {{"a", 0, 10, "rank-0.bin", 0, 40, 0xdeadbeef}, {"b", 0, 7, "rank-0.bin", 40, 28, 1}};
  m.files = {{"rank-0.bin", 68}};
  m.data = {LoaderState{72, "x\ny\n"}};
  absl::StatusOr<Manifest> back = ManifestFromJson(ManifestToJson(m), "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 9);
  EXPECT_EQ(back->world.strategy, "zero3");
  EXPECT_EQ(back->chunks[0].crc32c, 0xdeadbeefu);
  EXPECT_EQ(back->data[0].cursor, "x\ny\n");
  EXPECT_EQ(back->total_bytes(), 68u);
}

}  // namespace
}  // namespace dtrain
