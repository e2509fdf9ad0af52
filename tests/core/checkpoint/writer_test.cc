#include "core/checkpoint/writer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checkpoint/reader.h"
#include "core/checkpoint/tools.h"
#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/checkpoint/checkpoint_test_util.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CheckpointWriterTest, RanksWriteSharesAndTheManifestNamesEveryChunk) {
  const std::string dir = testing::FreshDir("ckpt_roundtrip");
  ASSERT_TRUE(testing::SaveStep(dir, 3).ok());
  EXPECT_EQ(LatestName(dir), "step-3");
  EXPECT_TRUE(fs::exists(dir + "/step-3/rank-0.bin"));
  EXPECT_TRUE(fs::exists(dir + "/step-3/rank-1.bin"));
  // Each value written once: 17 floats in all, no padding.
  EXPECT_EQ(fs::file_size(dir + "/step-3/rank-0.bin") + fs::file_size(dir + "/step-3/rank-1.bin"),
            17 * sizeof(float));
  // No temporary or stage files remain.
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr("tmp")));
    EXPECT_NE(entry.path().filename().string()[0], '.');
  }

  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-3");
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Manifest& m = reader->manifest();
  EXPECT_EQ(m.step, 3);
  EXPECT_EQ(m.optimizer_step, 3);
  EXPECT_EQ(m.chunks.size(), 4u);
  ASSERT_EQ(m.data.size(), 2u);
  EXPECT_EQ(m.data[1].consumed_sequences, 24);
  EXPECT_EQ(m.data[1].cursor, "cursor of rank 1\n");
  // A range across both ranks' chunks.
  std::vector<float> out(6);
  ASSERT_TRUE(reader->Read("a", 2, 8, out.data()).ok());
  EXPECT_THAT(out, ElementsAre(5, 6, 7, 8, 9, 10));
  std::vector<float> b(7);
  ASSERT_TRUE(reader->Read("b", 0, 7, b.data()).ok());
  EXPECT_EQ(b, testing::TensorValues("b", 3));
  EXPECT_TRUE(reader->VerifyAll().empty());
}

TEST(CheckpointWriterTest, AFlatShareAcrossARowIsSavedAsBoxesAndReadsBack) {
  const std::string dir = testing::FreshDir("ckpt_flat_share");
  // Three ranks share "a" (2, 5) as [0, 4), [4, 8), [8, 10): rank 1's share ends row 0 and
  // starts row 1, two boxes.
  ASSERT_TRUE(testing::SaveStep(dir, 3, /*world=*/3).ok());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-3");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> boxes;
  for (const ChunkRecord& c : reader->manifest().chunks) {
    if (c.tensor == "a") boxes.push_back(absl::StrCat(BoxToString(c.box), " ", c.file));
  }
  EXPECT_THAT(boxes, ElementsAre("[0:1, 0:4] rank-0.bin", "[0:1, 4:5] rank-1.bin",
                                 "[1:2, 0:3] rank-1.bin", "[1:2, 3:5] rank-2.bin"));
  std::vector<float> a(10);
  ASSERT_TRUE(reader->Read("a", 0, 10, a.data()).ok());
  EXPECT_EQ(a, testing::TensorValues("a", 3));
  std::vector<float> b(7);
  ASSERT_TRUE(reader->Read("b", 0, 7, b.data()).ok());
  EXPECT_EQ(b, testing::TensorValues("b", 3));
}

TEST(CheckpointWriterTest, EveryRangeAndBoxLoadsWhateverTheNumberOfSavingRanks) {
  const std::vector<float> a = testing::TensorValues("a", 3);  // (2, 5)
  for (int world = 1; world <= 4; ++world) {
    const std::string dir = testing::FreshDir(absl::StrCat("ckpt_any_", world));
    ASSERT_TRUE(testing::SaveStep(dir, 3, world).ok());
    absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-3");
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (int64_t begin = 0; begin <= 10; ++begin) {
      for (int64_t end = begin; end <= 10; ++end) {
        std::vector<float> out(static_cast<size_t>(end - begin));
        ASSERT_TRUE(reader->Read("a", begin, end, out.data()).ok());
        EXPECT_EQ(out, std::vector<float>(a.begin() + begin, a.begin() + end))
            << world << " ranks, [" << begin << ", " << end << ")";
      }
    }
    for (int64_t row = 0; row < 2; ++row) {
      for (int64_t rows = 1; row + rows <= 2; ++rows) {
        for (int64_t col = 0; col < 5; ++col) {
          for (int64_t cols = 1; col + cols <= 5; ++cols) {
            const Box box{{row, col}, {rows, cols}};
            std::vector<float> out(static_cast<size_t>(rows * cols)), expected;
            for (int64_t r = row; r < row + rows; ++r) {
              for (int64_t c = col; c < col + cols; ++c) expected.push_back(a[r * 5 + c]);
            }
            ASSERT_TRUE(reader->ReadBox("a", box, out.data()).ok());
            EXPECT_EQ(out, expected) << world << " ranks, box " << BoxToString(box);
          }
        }
      }
    }
  }
}

// Checkpoints past keep_last go once a newer one is complete, and so does what a removal a kill
// cut short left (Commit renames a pruned step-<N> to a hidden name first, so that such a kill
// leaves no step-<N> without its manifest; the rename itself is not observable here).
TEST(CheckpointWriterTest, KeepsTheLastCompleteOnesAndPointsLatestAtTheNewest) {
  const std::string dir = testing::FreshDir("ckpt_keep");
  fs::create_directories(dir + "/.step-1.pruned/x");  // a removal a kill cut short
  for (int step : {2, 4, 6}) ASSERT_TRUE(testing::SaveStep(dir, step).ok());
  EXPECT_FALSE(fs::exists(dir + "/.step-1.pruned"));
  EXPECT_FALSE(fs::exists(dir + "/step-2"));  // keep_last 2
  EXPECT_FALSE(fs::exists(dir + "/.step-2.pruned"));
  EXPECT_TRUE(fs::exists(dir + "/step-4/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step-6/manifest.json"));
  EXPECT_EQ(LatestName(dir), "step-6");
  EXPECT_THAT(CheckpointCandidates(dir), ElementsAre(dir + "/step-6", dir + "/step-4"));
}

// A save writes longer paths than the start-up probe: a folder so deep that a save's paths would
// pass PATH_MAX is refused at start (exit 2, a shorter checkpoint.dir), not at the first save
// after the training.
TEST(CheckpointWriterTest, AFolderTooDeepForItsSavesIsRefusedAtStart) {
  const std::string base = testing::FreshDir("ckpt_deep");
  std::string deep = base;
  // The probe's ".probe-rank-0" fits below PATH_MAX; ".step-1000.<16 hex>/manifest.json.tmp" not.
  while (deep.size() + 1 < 4096 - 20) {
    deep.append("/").append(std::min<size_t>(200, 4096 - 20 - deep.size() - 1), 'd');
  }
  const absl::Status refused = CheckCheckpointFolder(deep, 0, 1000);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("set checkpoint.dir to a shorter path"));
  EXPECT_THAT(refused.message(), HasSubstr("a save writes paths of up to 4"));
  EXPECT_EQ(ExitCodeOf(refused), kExitUsage);
  EXPECT_TRUE(CheckCheckpointFolder(base, 0, 1000).ok());
  fs::remove_all(base);
}

// Folders that only look like steps are not checkpoints: a step past int64 (which ended the
// process in std::stoll, at resume and in the save thread's pruning), a file, other names.
TEST(CheckpointWriterTest, StepFoldersAreNumberedFoldersWithinInt64) {
  const std::string dir = testing::FreshDir("ckpt_names");
  fs::create_directories(dir + "/step-99999999999999999999");
  fs::create_directories(dir + "/step-x");
  fs::create_directories(dir + "/step-");
  std::ofstream(dir + "/step-9");
  for (int step : {2, 4, 6}) ASSERT_TRUE(testing::SaveStep(dir, step).ok());
  EXPECT_TRUE(fs::exists(dir + "/step-99999999999999999999"));  // not pruned as a checkpoint
  EXPECT_THAT(CheckpointCandidates(dir), ElementsAre(dir + "/step-6", dir + "/step-4"));
  EXPECT_EQ(StepOfDirName("step-9223372036854775807"), INT64_MAX);
  EXPECT_EQ(StepOfDirName("step-9223372036854775808"), std::nullopt);
  EXPECT_EQ(StepOfDirName("step--1"), std::nullopt);
  EXPECT_EQ(StepOfDirName("steps-1"), std::nullopt);
}

TEST(CheckpointWriterTest, ARankThatNeverReportsLeavesNoCheckpointAndThePreviousIntact) {
  const std::string dir = testing::FreshDir("ckpt_killed");
  ASSERT_TRUE(testing::SaveStep(dir, 2).ok());
  // Step 4: rank 1 "dies" before writing; rank 0 writes its part and times out.
  const std::vector<std::vector<float>> tensors = {testing::TensorValues("a", 4),
                                                   testing::TensorValues("b", 4)};
  SaveRequest request = testing::RequestFor(dir, 4, 0, 2, tensors);
  request.timeout_s = 0.2;
  const absl::Status saved = WriteCheckpoint(request);
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.message(), HasSubstr("rank(s) 1 did not report"));
  EXPECT_FALSE(fs::exists(dir + "/step-4"));
  EXPECT_EQ(LatestName(dir), "step-2");
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir + "/step-2");
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE(reader->VerifyAll().empty());
  // The next attempt's save cleans the dead stage folder up.
  ASSERT_TRUE(testing::SaveStep(dir, 6).ok());
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_NE(entry.path().filename().string()[0], '.') << entry.path();
  }
}

// An earlier attempt's stage folder goes before a save writes, not after it succeeds: on a full
// disk it held the space the save needed, so no save could ever succeed again.
TEST(CheckpointWriterTest, EarlierAttemptsStageFoldersGoBeforeTheSaveWrites) {
  const std::string dir = testing::FreshDir("ckpt_stale_stage");
  const std::string stale = dir + "/.step-4.00000000deadbeef";
  fs::create_directories(stale);
  std::ofstream(stale + "/rank-0.bin") << std::string(4096, 'x');
  // This save fails at once: a file stands where its own stage folder would be.
  const std::vector<std::vector<float>> tensors = {testing::TensorValues("a", 6),
                                                   testing::TensorValues("b", 6)};
  const SaveRequest request = testing::RequestFor(dir, 6, 0, 1, tensors);
  std::ofstream(absl::StrFormat("%s/.step-6.%016x", dir, request.nonce)) << "in the way";
  EXPECT_FALSE(WriteCheckpoint(request).ok());
  EXPECT_FALSE(fs::exists(stale));
}

TEST(CheckpointWriterTest, AnExistingStepFolderIsMovedAsideNotOverwritten) {
  const std::string dir = testing::FreshDir("ckpt_aside");
  ASSERT_TRUE(testing::SaveStep(dir, 4).ok());
  std::filesystem::remove(dir + "/step-4/manifest.json");  // a damaged one
  ASSERT_TRUE(testing::SaveStep(dir, 4).ok());
  bool found_aside = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("step-4.replaced-", 0) == 0) found_aside = true;
  }
  EXPECT_TRUE(found_aside);
  EXPECT_TRUE(CheckpointReader::Open(dir + "/step-4").ok());
  // ckpt inspect counts it (it listed only the step-<N> folders).
  const InspectReport report = InspectCheckpoints(dir);
  EXPECT_TRUE(report.valid) << report.text;
  EXPECT_THAT(report.text,
              ::testing::ContainsRegex("also 1 set-aside folder\\(s\\), [0-9.]+ MiB in all: "
                                       "step-4\\.replaced-[0-9a-f]{16} \\(.*remove them"));
}

// A save whose `latest` cannot be written fails saying that the checkpoint itself is complete
// (it said only that the checkpoint failed), and a resume finds it.
TEST(CheckpointWriterTest, ALatestThatCannotBeWrittenSaysTheCheckpointIsComplete) {
  const std::string dir = testing::FreshDir("ckpt_latest");
  fs::create_directories(dir + "/latest.tmp");  // in latest's way: a folder
  const absl::Status saved = testing::SaveStep(dir, 4);
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(std::string(saved.message()),
              ::testing::HasSubstr(dir +
                                   "/step-4 is complete (a resume finds it), but latest "
                                   "could not name it: create " +
                                   dir + "/latest.tmp: "));
  EXPECT_TRUE(CheckpointReader::Open(dir + "/step-4").ok());
  EXPECT_THAT(CheckpointCandidates(dir), ElementsAre(dir + "/step-4"));
}

TEST(CheckpointWriterTest, AsyncWriterSavesFromStagingAndReportsErrors) {
  const std::string dir = testing::FreshDir("ckpt_async");
  CheckpointWriter writer(/*async=*/true);
  const std::vector<std::vector<float>> tensors = {testing::TensorValues("a", 5),
                                                   testing::TensorValues("b", 5)};
  absl::StatusOr<float*> staging = writer.Stage(17);
  ASSERT_TRUE(staging.ok());
  std::copy(tensors[0].begin(), tensors[0].end(), *staging);
  std::copy(tensors[1].begin(), tensors[1].end(), *staging + 10);
  SaveRequest request = testing::RequestFor(dir, 5, 0, 1, tensors);
  request.chunks = {{"a", Box{{0, 0}, {2, 5}}, *staging}, {"b", Box{{0}, {7}}, *staging + 10}};
  ASSERT_TRUE(writer.Save(request).ok());
  ASSERT_TRUE(writer.Wait().ok());
  EXPECT_EQ(LatestName(dir), "step-5");

  request.dir = "/proc/no/such/folder";
  ASSERT_TRUE(writer.Save(request).ok());  // started; the failure comes with Wait
  const absl::Status failed = writer.Wait();
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr("/proc/no/such/folder"));
}

// Poll gives a finished background save's failure, once.
TEST(CheckpointWriterTest, PollReportsAFinishedBackgroundSavesFailureOnce) {
  CheckpointWriter writer(/*async=*/true);
  EXPECT_TRUE(writer.Poll().ok());  // no save
  const std::vector<std::vector<float>> tensors = {testing::TensorValues("a", 5)};
  SaveRequest request = testing::RequestFor("/proc/no/such/folder", 5, 0, 1, tensors);
  ASSERT_TRUE(writer.Save(request).ok());
  absl::Status polled = absl::OkStatus();
  for (int i = 0; i < 1000 && polled.ok(); ++i) {
    polled = writer.Poll();
    if (polled.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(std::string(polled.message()), HasSubstr("/proc/no/such/folder"));
  EXPECT_TRUE(writer.Poll().ok());
  EXPECT_TRUE(writer.Wait().ok());
}

}  // namespace
}  // namespace dtrain
