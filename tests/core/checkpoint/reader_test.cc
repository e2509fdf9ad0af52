#include "core/checkpoint/reader.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "core/checkpoint/crc32c.h"
#include "core/checkpoint/tools.h"
#include "core/util/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/core/checkpoint/checkpoint_test_util.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
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

// Rewrites the manifest of `step_dir` through `edit`, then opens the checkpoint: how the tests of
// a damaged manifest damage it.
absl::StatusOr<CheckpointReader> OpenEdited(const std::string& step_dir,
                                            const std::function<void(Manifest&)>& edit) {
  const std::string path = step_dir + "/manifest.json";
  absl::StatusOr<Manifest> manifest = ManifestFromJson(*ReadWholeFile(path), path);
  if (!manifest.ok()) return manifest.status();
  edit(*manifest);
  std::ofstream(path) << ManifestToJson(*manifest);
  return CheckpointReader::Open(step_dir);
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
  EXPECT_THAT(status.message(), HasSubstr("chunk a[1:2, 0:5] in rank-1.bin at byte 0"));
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

// A manifest that exists but cannot be read is that error, not an incomplete save (which a resume
// passes over for an older checkpoint).
TEST(CheckpointReaderTest, AnUnreadableManifestIsNotAnIncompleteSave) {
  const std::string dir = testing::FreshDir("ckpt_unreadable");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  fs::remove(dir + "/step-2/manifest.json");
  fs::create_directory(dir + "/step-2/manifest.json");
  const absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
  EXPECT_THAT(reader.status().message(),
              HasSubstr(dir + "/step-2/manifest.json is a folder, not a file"));
}

// A chunk is read only from inside a rank file the manifest lists: one naming a file outside the
// step folder, or bytes past its file's end, is a damaged manifest when the checkpoint opens.
TEST(CheckpointReaderTest, AChunkOutsideTheListedFilesIsADamagedManifest) {
  const std::string dir = testing::FreshDir("ckpt_chunk_file");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  std::ofstream(dir + "/outside.bin") << std::string(64, 'x');
  const std::string path = dir + "/step-2/manifest.json";
  const std::string text = *ReadWholeFile(path);
  for (const bool past_the_end : {false, true}) {
    absl::StatusOr<Manifest> manifest = ManifestFromJson(text, path);
    ASSERT_TRUE(manifest.ok());
    if (past_the_end) {
      manifest->chunks[0].offset = manifest->files[0].bytes - manifest->chunks[0].bytes + 1;
    } else {
      manifest->chunks[0].file = "../outside.bin";
    }
    std::ofstream(path) << ManifestToJson(*manifest);
    const absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << past_the_end;
    EXPECT_THAT(reader.status().message(), HasSubstr("lies outside the files the manifest lists"));
  }
}

// A manifest of another step than its folder's would resume at the wrong step, silently.
TEST(CheckpointReaderTest, AManifestOfAnotherStepThanItsFolderIsDamaged) {
  const std::string dir = testing::FreshDir("ckpt_step_mismatch");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  const absl::StatusOr<CheckpointReader> reader =
      OpenEdited(dir + "/step-2", [](Manifest& manifest) { manifest.step = 1; });
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(),
              HasSubstr("manifest.json is of step 1, not of its folder's step 2"));
  // Named with a trailing slash (checkpoint.resume: runs/x/checkpoints/step-2/) too.
  EXPECT_EQ(CheckpointReader::Open(dir + "/step-2/").status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointReaderTest, ADamagedManifestIsRejected) {
  const std::string dir = testing::FreshDir("ckpt_badmanifest");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  std::ofstream(dir + "/step-2/manifest.json") << "{\"format\": \"dtrain-checkpoint\"";
  const absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("manifest.json"));
}

// The manifest checks itself: a digit changed in the text (the step, the learning rate, a data
// cursor) is damage, where it once resumed at another data position unnoticed. One written
// before the checksum (none in it) still opens.
TEST(CheckpointReaderTest, AnEditedManifestFailsItsChecksum) {
  const std::string dir = testing::FreshDir("ckpt_edited_manifest");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  const std::string path = dir + "/step-2/manifest.json";
  const std::string text = *ReadWholeFile(path);
  const size_t step = text.find("\"optimizer_step\": ");
  ASSERT_NE(step, std::string::npos) << text;
  std::string edited = text;
  edited[step + 18] = edited[step + 18] == '7' ? '8' : '7';
  std::ofstream(path) << edited;
  const absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(),
              HasSubstr("its checksum does not match its contents: it was edited or damaged"));

  nlohmann::json without = nlohmann::json::parse(text);
  without.erase("crc32c");
  std::ofstream(path) << without.dump(1);
  EXPECT_TRUE(CheckpointReader::Open(dir + "/step-2").ok());
}

TEST(CheckpointReaderTest, ManifestRoundTripsThroughJson) {
  Manifest m = testing::BaseManifest();
  m.step = 9;
  m.world = WorldRecord{4, "zero3", 4, 1, 1};
  m.chunks = {{"a", Box{{0, 0}, {2, 5}}, DataType::kF32, "rank-0.bin", 0, 40, 0xdeadbeef},
              {"b", Box{{0}, {7}}, DataType::kF32, "rank-0.bin", 40, 28, 1}};
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

// A version 1 checkpoint as the code before tensor parallelism wrote it (the manifest's fields and
// layout as its ManifestToJson dumped them): "a" (2, 5) saved as the flat ranges [0, 3) by rank 0
// and [3, 10) by rank 1, which are no single boxes of it; "b" (7) whole by rank 0.
std::string WriteVersion1Checkpoint(const std::string& name) {
  const std::string dir = testing::FreshDir(name) + "/step-4";
  fs::create_directories(dir);
  const std::vector<float> a = testing::TensorValues("a", 4), b = testing::TensorValues("b", 4);
  std::vector<float> rank0(a.begin(), a.begin() + 3);
  rank0.insert(rank0.end(), b.begin(), b.end());
  const std::vector<float> rank1(a.begin() + 3, a.end());
  std::ofstream(dir + "/rank-0.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(rank0.data()), rank0.size() * sizeof(float));
  std::ofstream(dir + "/rank-1.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(rank1.data()), rank1.size() * sizeof(float));
  const auto crc = [](const float* values, size_t n) {
    return absl::StrFormat("%08x", Crc32c(0, values, n * sizeof(float)));
  };
  const std::string manifest = absl::StrReplaceAll(R"({
 "chunks": [
  {"begin": 0, "bytes": 12, "crc32c": "CRC_A0", "end": 3, "file": "rank-0.bin", "offset": 0,
   "tensor": "a"},
  {"begin": 0, "bytes": 28, "crc32c": "CRC_B", "end": 7, "file": "rank-0.bin", "offset": 12,
   "tensor": "b"},
  {"begin": 3, "bytes": 28, "crc32c": "CRC_A1", "end": 10, "file": "rank-1.bin", "offset": 0,
   "tensor": "a"}
 ],
 "data": [{"consumed_sequences": 32, "cursor": "c0"}, {"consumed_sequences": 32, "cursor": "c1"}],
 "dtrain_version": "0.1.0",
 "files": [{"bytes": 40, "name": "rank-0.bin"}, {"bytes": 28, "name": "rank-1.bin"}],
 "format": "dtrain-checkpoint",
 "format_version": 1,
 "lr": 0.001,
 "metrics_line": "",
 "optimizer_step": 4,
 "recipe": "run:\n  seed: 1\n",
 "recipe_hash": "0000000000000000",
 "seed": 1,
 "step": 4,
 "tensors": [{"name": "a", "numel": 10, "shape": [2, 5]}, {"name": "b", "numel": 7, "shape": [7]}],
 "world": {"dp": 2, "pp": 1, "strategy": "zero1", "tp": 1, "world_size": 2}
}
)",
                                                   {{"CRC_A0", crc(rank0.data(), 3)},
                                                    {"CRC_B", crc(rank0.data() + 3, 7)},
                                                    {"CRC_A1", crc(rank1.data(), 7)}});
  std::ofstream(dir + "/manifest.json") << manifest;
  return dir;
}

TEST(CheckpointReaderTest, AVersion1CheckpointLoads) {
  const std::string dir = WriteVersion1Checkpoint("ckpt_v1");
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->manifest().format_version, 1);
  EXPECT_EQ(reader->manifest().tensors[0].shape, (std::vector<int64_t>{2, 5}));
  std::vector<float> a(10);
  ASSERT_TRUE(reader->Read("a", 0, 10, a.data()).ok());
  EXPECT_EQ(a, testing::TensorValues("a", 4));
  std::vector<float> part(6);
  ASSERT_TRUE(reader->Read("a", 1, 7, part.data()).ok());  // across both ranks' chunks
  EXPECT_THAT(part, ElementsAre(5, 6, 7, 8, 9, 10));
  std::vector<float> b(7);
  ASSERT_TRUE(reader->Read("b", 0, 7, b.data()).ok());
  EXPECT_EQ(b, testing::TensorValues("b", 4));
  EXPECT_TRUE(reader->VerifyAll().empty());
  const InspectReport report = InspectCheckpoints(dir);
  EXPECT_TRUE(report.valid) << report.text;
  EXPECT_THAT(report.text, HasSubstr("format 1"));
  EXPECT_THAT(report.text, HasSubstr("a (2, 5) f32: [0:3] rank-0.bin, [3:10] rank-1.bin"));
}

TEST(CheckpointReaderTest, AVersion1ChecksumErrorNamesTheFlatRange) {
  const std::string dir = WriteVersion1Checkpoint("ckpt_v1_flip");
  FlipByte(dir + "/rank-1.bin", 2);
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> a(10);
  const absl::Status status = reader->Read("a", 0, 10, a.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("chunk a[3:10] in rank-1.bin at byte 0"));
}

// Tensor-parallel shards of a (4, 6) matrix by columns: each rank's slice is one chunk.
absl::Status SaveColumnSlices(const std::string& dir, const std::vector<float>& w) {
  std::vector<std::vector<float>> slices(2);
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t col = 0; col < 6; ++col) slices[col / 3].push_back(w[row * 6 + col]);
  }
  const auto request = [&](int rank) {
    SaveRequest r;
    r.dir = dir;
    r.step = 1;
    r.rank = rank;
    r.world = 2;
    r.nonce = 7;
    r.timeout_s = 10;
    r.manifest = testing::BaseManifest();
    r.manifest.tensors = {{"w", {4, 6}, 24}};
    r.chunks.push_back({"w", Box{{0, 3 * rank}, {4, 3}}, slices[rank].data()});
    return r;
  };
  std::thread other([&] { (void)WriteCheckpoint(request(1)); });
  const absl::Status saved = WriteCheckpoint(request(0));
  other.join();
  return saved;
}

TEST(CheckpointReaderTest, ColumnSlicesAreOneChunkEachAndLoadAsAnyRangeOrBox) {
  const std::string dir = testing::FreshDir("ckpt_columns");
  std::vector<float> w(24);
  std::iota(w.begin(), w.end(), 0.0f);
  ASSERT_TRUE(SaveColumnSlices(dir, w).ok());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-1");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->manifest().format_version, 2);
  ASSERT_EQ(reader->manifest().chunks.size(), 2u);
  EXPECT_EQ(reader->manifest().chunks[1].box, (Box{{0, 3}, {4, 3}}));
  // A flat range (what a data-parallel shard holds): a partial row, a whole row, a partial row.
  std::vector<float> range(15);
  ASSERT_TRUE(reader->Read("w", 5, 20, range.data()).ok());
  EXPECT_EQ(range, std::vector<float>(w.begin() + 5, w.begin() + 20));
  std::vector<float> all(24);
  ASSERT_TRUE(reader->Read("w", 0, 24, all.data()).ok());
  EXPECT_EQ(all, w);
  // A row slice across both column chunks, and a box inside one.
  std::vector<float> rows(12);
  ASSERT_TRUE(reader->ReadBox("w", Box{{1, 0}, {2, 6}}, rows.data()).ok());
  EXPECT_EQ(rows, std::vector<float>(w.begin() + 6, w.begin() + 18));
  std::vector<float> inner(4);
  ASSERT_TRUE(reader->ReadBox("w", Box{{2, 1}, {2, 2}}, inner.data()).ok());
  EXPECT_THAT(inner, ElementsAre(13, 14, 19, 20));
  const absl::Status outside = reader->ReadBox("w", Box{{3, 0}, {2, 6}}, inner.data());
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("box [3:5, 0:6] of w is outside its shape [0:4, 0:6]"));
}

// What a tensor-parallel rank reads: several boxes at once (here the two middle rows of both
// column chunks, as two row boxes, and a partial last row), in flat order.
TEST(CheckpointReaderTest, SeveralBoxesLoadTogetherInFlatOrder) {
  const std::string dir = testing::FreshDir("ckpt_boxes");
  std::vector<float> w(24);
  std::iota(w.begin(), w.end(), 0.0f);
  ASSERT_TRUE(SaveColumnSlices(dir, w).ok());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-1");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> rows(12), last(2);
  const std::vector<Box> boxes = {Box{{1, 0}, {2, 6}}, Box{{3, 4}, {1, 2}}};
  ASSERT_TRUE(reader->ReadBoxes("w", boxes, {rows.data(), last.data()}).ok());
  EXPECT_EQ(rows, std::vector<float>(w.begin() + 6, w.begin() + 18));
  EXPECT_THAT(last, ElementsAre(22, 23));
  const absl::Status unordered =
      reader->ReadBoxes("w", {boxes[1], boxes[0]}, {last.data(), rows.data()});
  EXPECT_EQ(unordered.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unordered.message(), HasSubstr("boxes of w out of flat order"));
}

TEST(CheckpointReaderTest, OverlappingChunksAreADamagedManifest) {
  const std::string dir = testing::FreshDir("ckpt_overlap");
  std::vector<float> w(24);
  ASSERT_TRUE(SaveColumnSlices(dir, w).ok());
  const absl::StatusOr<CheckpointReader> reader =
      OpenEdited(dir + "/step-1", [](Manifest& manifest) {
        manifest.chunks[1].box = Box{{0, 2}, {4, 3}};  // columns 2..4: column 2 twice
      });
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(),
              HasSubstr("chunk w[0:4, 0:3] in rank-0.bin at byte 0 overlaps chunk w[0:4, 2:5]"));
}

// Chunks that add up to more than their tensor are damage, found before their sum could overflow
// (two chunks of a tensor of 2^62 elements would).
TEST(CheckpointReaderTest, ChunksHoldingMoreThanTheirTensorAreADamagedManifest) {
  const std::string dir = testing::FreshDir("ckpt_surplus");
  std::vector<float> w(24);
  ASSERT_TRUE(SaveColumnSlices(dir, w).ok());
  const absl::StatusOr<CheckpointReader> reader = OpenEdited(
      dir + "/step-1", [](Manifest& manifest) { manifest.chunks.push_back(manifest.chunks[0]); });
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("the chunks of tensor w hold more than its 24"));
}

TEST(CheckpointReaderTest, AShapeThatDisagreesWithTheElementCountIsADamagedManifest) {
  const std::string dir = testing::FreshDir("ckpt_badshape");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  const absl::StatusOr<CheckpointReader> reader =
      OpenEdited(dir + "/step-2", [](Manifest& manifest) {
        manifest.tensors[0].shape = {int64_t{1} << 40, int64_t{1} << 40};  // overflows int64
      });
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("tensor a has shape"));
  EXPECT_THAT(reader.status().message(), HasSubstr("but 10 elements"));
}

TEST(CheckpointReaderTest, AChunkOutsideItsTensorIsADamagedManifest) {
  const std::string dir = testing::FreshDir("ckpt_outside");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  const absl::StatusOr<CheckpointReader> reader =
      OpenEdited(dir + "/step-2", [](Manifest& manifest) {
        manifest.chunks[0].box.offsets[0] = 2;  // row 2 of a (2, 5) tensor
      });
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("does not fit tensor a of shape [0:2, 0:5]"));
}

}  // namespace
}  // namespace dtrain
