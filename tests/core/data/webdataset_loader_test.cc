#include "core/data/webdataset_loader.h"

#include <sys/resource.h>

#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/data/shard_urls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/data/tar_test_util.h"

namespace dtrain {
namespace {

constexpr int kSeqLen = 4;
constexpr int kBatch = 8;  // global batch: sequences per step over all ranks

using Windows = std::vector<std::vector<int32_t>>;  // each: inputs then the last target

class WebDatasetLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 6 shards x 7 samples of 1..5 tokens each.
    ASSERT_TRUE(testing::RunPython(testing::TestScript("make_shards.py") + " tokens " +
                                   dir_.path() + " 6 7"));
    config_.urls = *ExpandShardUrls(dir_.path() + "/shard-{000..005}.tar");
    config_.num_streams = 4;
    config_.seed = 7;
    config_.block_samples = 3;
    config_.seq_len = kSeqLen;
    config_.eos_id = 0;
    config_.vocab_size = 1 << 16;
  }

  std::unique_ptr<WebDatasetLoader> Loader(int rank, int world) const {
    WebDatasetOptions options{.stream = config_,
                              .read_ahead_bytes = 256,  // a few windows: the queue fills often
                              .global_batch = kBatch,
                              .rank = rank,
                              .world = world};
    absl::StatusOr<std::unique_ptr<WebDatasetLoader>> loader = WebDatasetLoader::Create(options);
    EXPECT_TRUE(loader.ok()) << loader.status();
    return std::move(loader).value();
  }

  // `steps` steps of one rank's share of the global batch.
  static Windows Read(WebDatasetLoader& loader, int world, int steps) {
    const int count = kBatch / world;
    Windows windows;
    for (int step = 0; step < steps; ++step) {
      std::vector<int32_t> inputs(count * kSeqLen), targets(count * kSeqLen);
      const absl::Status status = loader.Next(count, inputs.data(), targets.data());
      EXPECT_TRUE(status.ok()) << status;
      for (int i = 0; i < count; ++i) {
        std::vector<int32_t> window(inputs.begin() + i * kSeqLen,
                                    inputs.begin() + (i + 1) * kSeqLen);
        window.push_back(targets[(i + 1) * kSeqLen - 1]);
        windows.push_back(window);
      }
    }
    return windows;
  }

  // The global sequence as `world` ranks read it, reassembled: rank r's i-th is i * world + r.
  Windows ReadAllRanks(int world, int steps) const {
    Windows global(static_cast<size_t>(kBatch) * steps);
    for (int rank = 0; rank < world; ++rank) {
      std::unique_ptr<WebDatasetLoader> loader = Loader(rank, world);
      const Windows windows = Read(*loader, world, steps);
      EXPECT_EQ(windows.size(), global.size() / world);  // equal counts on every rank
      for (size_t i = 0; i < windows.size(); ++i) global[i * world + rank] = windows[i];
    }
    return global;
  }

  // One process's `before` steps, then a new loader restored from its state reading `after`.
  Windows ReadResumedAfter(int before, int after) const {
    std::unique_ptr<WebDatasetLoader> first = Loader(0, 1);
    Windows windows = Read(*first, 1, before);
    const LoaderState state = first->state();
    EXPECT_EQ(state.consumed_sequences, before * kBatch);
    first.reset();
    std::unique_ptr<WebDatasetLoader> second = Loader(0, 1);
    const absl::Status restored = second->Restore(state);
    EXPECT_TRUE(restored.ok()) << restored;
    const Windows rest = Read(*second, 1, after);
    windows.insert(windows.end(), rest.begin(), rest.end());
    return windows;
  }

  testing::TempDir dir_;
  StreamConfig config_;
};

// A rank's streams each keep a shard open: more than half the open-file limit allows is refused
// before any opens (10 million streams ran out of files at the run's end), once the soft limit
// is raised as far as the hard one allows.
TEST(CheckStreamsSplitTest, StreamsMustSplitAndFitTheOpenFileLimit) {
  EXPECT_TRUE(CheckStreamsSplit(8, 4).ok());
  EXPECT_TRUE(absl::StrContains(CheckStreamsSplit(6, 4).message(), "not a multiple of the 4"));
  struct rlimit original;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  ASSERT_TRUE(original.rlim_max == RLIM_INFINITY || original.rlim_max >= 132);
  struct rlimit lowered = original;
  lowered.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  EXPECT_TRUE(CheckStreamsSplit(128, 4).ok());  // 32 a rank: the limit stays
  struct rlimit after;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, 64u);
  const absl::Status raised = CheckStreamsSplit(66, 1);
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &after), 0);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &original), 0);
  EXPECT_TRUE(raised.ok()) << raised;
  EXPECT_EQ(after.rlim_cur, 132u);
  // A hard limit cannot be raised again: a child process lowers its own (started afresh, as this
  // one runs threads).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto under_a_hard_limit_of_100 = [] {
    const struct rlimit hard = {.rlim_cur = 64, .rlim_max = 100};
    if (::setrlimit(RLIMIT_NOFILE, &hard) != 0) std::_Exit(3);
    std::cerr << CheckStreamsSplit(66, 1).message();
    std::_Exit(0);
  };
  EXPECT_EXIT(
      under_a_hard_limit_of_100(), ::testing::ExitedWithCode(0),
      "^data\\.streams = 66 gives each of the 1 data-parallel ranks 66 streams, each with a "
      "shard open, and a process may open 100 files \\(ulimit -n; its hard limit, ulimit -Hn, is "
      "100\\): lower data\\.streams, or raise the hard limit to at least 132$");
}

TEST_F(WebDatasetLoaderTest, SameSeedSameSequenceAndEveryTokenIsData) {
  const Windows first = ReadAllRanks(1, 10);  // 80 windows: several passes over 42 samples
  EXPECT_EQ(ReadAllRanks(1, 10), first);
  for (const std::vector<int32_t>& window : first) {
    for (const int32_t token : window) {
      EXPECT_TRUE(token == 0 || (token % 1000 < 7 && token / 1000 < 6)) << token;
    }
  }
  config_.seed = 8;
  EXPECT_NE(ReadAllRanks(1, 10), first);
}

TEST_F(WebDatasetLoaderTest, TwoAndFourRanksCoverTheSingleProcessSequence) {
  const Windows single = ReadAllRanks(1, 12);
  EXPECT_EQ(ReadAllRanks(2, 12), single);
  EXPECT_EQ(ReadAllRanks(4, 12), single);
}

TEST_F(WebDatasetLoaderTest, ResumesAtAStepBoundaryIdentically) {
  const Windows whole = ReadAllRanks(1, 9);
  EXPECT_EQ(ReadResumedAfter(4, 5), whole);
}

// A block also ends with the sample that reaches block_bytes: with one byte, every block is one
// sample, the order of no shuffle at all; with a few, blocks of 1-3 samples resume exactly.
TEST_F(WebDatasetLoaderTest, ABlockEndsAtItsByteBound) {
  config_.block_samples = 1;
  const Windows unshuffled = ReadAllRanks(1, 6);
  config_.block_samples = 3;
  ASSERT_NE(ReadAllRanks(1, 6), unshuffled);
  config_.block_bytes = 1;
  EXPECT_EQ(ReadAllRanks(1, 6), unshuffled);

  config_.block_bytes = 8;
  const Windows whole = ReadAllRanks(1, 9);
  EXPECT_NE(whole, unshuffled);
  EXPECT_EQ(ReadResumedAfter(4, 5), whole);
}

// Shards whose samples hold no token are an error once a stream has read as many of them in a
// row as there are shards; the loader read them forever, at 100% CPU, never returning a batch.
TEST_F(WebDatasetLoaderTest, ShardsWithoutTokensAreAnError) {
  for (const char* name : {"empty-0.tar", "empty-1.tar"}) {
    ASSERT_TRUE(testing::RunPython(absl::StrCat(testing::TestScript("make_shards.py"), " pax ",
                                                dir_.path(), "/", name, " a.tokens= b.tokens=")));
  }
  config_.urls = *ExpandShardUrls(dir_.path() + "/empty-{0..1}.tar");
  config_.num_streams = 1;
  std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
  std::vector<int32_t> inputs(kBatch * kSeqLen), targets(kBatch * kSeqLen);
  const absl::Status status = loader->Next(kBatch, inputs.data(), targets.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "2 shards in a row held no tokens")) << status;
}

TEST_F(WebDatasetLoaderTest, ResumesIntoAnotherWorldSizeAtTheSameGlobalSequence) {
  const Windows whole = ReadAllRanks(1, 9);
  // 4 ranks run 5 steps and save; their merged state restores into 2 ranks for 4 more steps.
  std::vector<LoaderState> saved;
  for (int rank = 0; rank < 4; ++rank) {
    std::unique_ptr<WebDatasetLoader> loader = Loader(rank, 4);
    Read(*loader, 4, 5);
    saved.push_back(loader->state());
  }
  absl::StatusOr<LoaderState> merged = MergeLoaderStates(saved);
  ASSERT_TRUE(merged.ok()) << merged.status();
  for (int rank = 0; rank < 2; ++rank) {
    std::unique_ptr<WebDatasetLoader> loader = Loader(rank, 2);
    // One rank's own state lacks the streams this rank now reads.
    EXPECT_FALSE(loader->Restore(saved[1 - rank]).ok());
    ASSERT_TRUE(loader->Restore(*merged).ok());
    // 3 sequences consumed cannot continue on 2 ranks: the error says what width would.
    const absl::Status odd = loader->Restore({3, merged->cursor});
    EXPECT_TRUE(absl::StrContains(odd.message(), "consumed 3 sequences, which 2 data-parallel"))
        << odd;
    ASSERT_TRUE(loader->Restore(*merged).ok());
    const Windows windows = Read(*loader, 2, 4);
    if (rank == 1) {
      // Another data.streams cannot continue the order: the error names the streams and the
      // widths that continue it (4 streams, 5 steps of kBatch = 8 sequences consumed: 1, 2, 4).
      config_.num_streams = 8;
      const absl::Status streams = Loader(0, 2)->Restore(*merged);
      config_.num_streams = 4;
      EXPECT_TRUE(absl::StrContains(streams.message(),
                                    "has data.streams = 4, this run 8; set data.streams: 4 to "
                                    "continue the same order, on a data-parallel width of 1, 2, 4 "
                                    "ranks"))
          << streams;
    }
    for (size_t i = 0; i < windows.size(); ++i) {
      EXPECT_EQ(windows[i], whole[5 * kBatch + i * 2 + rank]) << "rank " << rank << " i " << i;
    }
  }
}

TEST_F(WebDatasetLoaderTest, RejectsWorldSizesThatDoNotDivideTheStreams) {
  WebDatasetOptions options{.stream = config_, .global_batch = 6, .rank = 0, .world = 3};
  absl::StatusOr<std::unique_ptr<WebDatasetLoader>> loader = WebDatasetLoader::Create(options);
  ASSERT_FALSE(loader.ok());
  EXPECT_TRUE(absl::StrContains(loader.status().message(), "data.streams = 4")) << loader.status();
}

// A shuffle block larger than a stream's share of the data spans more than a pass: stream 0 says
// so once, with the data's size per pass and the buffer that keeps a block within one. Two
// streams over 6 shards of 7 samples: stream 0 reads slots 0, 2 and 4 of each pass, 21 samples.
TEST_F(WebDatasetLoaderTest, ABlockLargerThanTheDataWarnsOnce) {
  config_.num_streams = 2;
  const auto warnings_of = [this] {
    ::testing::internal::CaptureStderr();
    std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
    Read(*loader, 1, 10);
    return ::testing::internal::GetCapturedStderr();
  };
  EXPECT_EQ(warnings_of(), "");  // blocks of 3 samples
  config_.block_samples = 1000;
  const std::string warnings = warnings_of();
  const std::string warning = "data stream 0's shuffle block holds a whole pass of its share";
  const size_t first = warnings.find(warning);
  ASSERT_NE(first, std::string::npos) << warnings;
  EXPECT_EQ(warnings.find(warning, first + 1), std::string::npos) << warnings;
  EXPECT_THAT(warnings, ::testing::HasSubstr("(21 samples,"));
  EXPECT_THAT(warnings, ::testing::HasSubstr("lower data.shuffle_buffer to 42 or less"));
  // Blocks of exactly one pass each, the later ones starting part way into a shard: none spans
  // more.
  config_.block_samples = 21;
  EXPECT_EQ(warnings_of(), "");
}

TEST_F(WebDatasetLoaderTest, FailsOrSkipsABadShardByDataOnError) {
  std::string cut = testing::ReadFile(dir_ / "shard-003.tar");
  cut.resize(3000);
  testing::WriteFile(dir_ / "shard-003.tar", cut);
  {
    std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
    std::vector<int32_t> inputs(80 * kSeqLen), targets(80 * kSeqLen);
    const absl::Status status = loader->Next(80, inputs.data(), targets.data());
    ASSERT_FALSE(status.ok());
    EXPECT_TRUE(absl::StrContains(status.message(), "shard-003.tar, byte ")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "skip_shard")) << status;
  }
  config_.skip_bad_shards = true;
  const std::string warning = "skipping shard " + (dir_ / "shard-003.tar");
  const auto warned_once = [&warning](const std::string& warnings) {
    const size_t first = warnings.find(warning);
    return first != std::string::npos && warnings.find(warning, first + 1) == std::string::npos;
  };
  ::testing::internal::CaptureStderr();
  std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
  const Windows windows = Read(*loader, 1, 10);
  std::string warnings = ::testing::internal::GetCapturedStderr();
  int from_bad = 0;
  for (const std::vector<int32_t>& window : windows) {
    for (const int32_t token : window) from_bad += token / 1000 == 3;
  }
  // Samples before the cut are used; the rest of shard 3 is skipped, never a hang.
  EXPECT_GT(from_bad, 0);
  EXPECT_EQ(windows.size(), 80u);
  EXPECT_TRUE(warned_once(warnings)) << warnings;
  // Unshuffled, shard 3 is slot 6p + 3 of pass p: streams 3 and 1 read it in turn, and the rank
  // warns about it once (each stream warned).
  config_.shard_shuffle = false;
  ::testing::internal::CaptureStderr();
  loader = Loader(0, 1);
  Read(*loader, 1, 20);
  warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(warnings, ::testing::HasSubstr("(data stream 3, pass 0)"));
  EXPECT_TRUE(warned_once(warnings)) << warnings;
  config_.shard_shuffle = true;

  // One stream skips shard 3 on each of its passes, and warns about it once.
  config_.num_streams = 1;
  loader = Loader(0, 1);
  std::vector<int32_t> inputs(80 * kSeqLen), targets(80 * kSeqLen);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(loader->Next(80, inputs.data(), targets.data()).ok());
  warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_GE(loader->shard_counts().skipped, 2);
  EXPECT_TRUE(warned_once(warnings)) << warnings;

  // A single shard, partly readable: each pass trains on its samples before the cut (the run
  // failed: one failure was "as many as there are shards").
  config_.urls = {dir_ / "shard-003.tar"};
  loader = Loader(0, 1);
  ::testing::internal::CaptureStderr();
  const absl::Status partly = loader->Next(80, inputs.data(), targets.data());
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(partly.ok()) << partly;
  for (const int32_t token : inputs) EXPECT_TRUE(token == 0 || token / 1000 == 3) << token;

  // Shards that all fail before their first token end the stream with an error, not a loop.
  config_.urls = {dir_ / "missing-0.tar", dir_ / "missing-1.tar", dir_ / "missing-2.tar"};
  loader = Loader(0, 1);
  ::testing::internal::CaptureStderr();
  const absl::Status none = loader->Next(1, inputs.data(), targets.data());
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(
      none.message(), "data stream 0: every shard it reads (3) failed before its first token"))
      << none;

  // Shards that each give samples without tokens and are then cut give no token either: the
  // same error (a trainer on two such shards looped over them forever, deaf to SIGTERM).
  const std::string tokenless =
      TarHeader("s0.tokens", 0) + TarHeader("s1.tokens", 0) + TarHeader("s2.tokens", 4) + "ab";
  testing::WriteFile(dir_ / "tokenless-0.tar", tokenless);
  testing::WriteFile(dir_ / "tokenless-1.tar", tokenless);
  config_.urls = {dir_ / "tokenless-0.tar", dir_ / "tokenless-1.tar"};
  config_.num_streams = 2;
  loader = Loader(0, 1);
  ::testing::internal::CaptureStderr();
  const absl::Status tokenless_status = loader->Next(1, inputs.data(), targets.data());
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(tokenless_status.message(),
                                "every shard it reads (2) failed before its first token"))
      << tokenless_status;
}

// A shard that fails before its first token is skipped unread on the passes that follow, and a
// good one beside it carries the run: over two shuffled shards, a bad one that ended a pass and
// began the next counted as every shard failing, and each of the passes that fill the blocks
// over a small dataset ran its command (or waited out its server) again.
TEST_F(WebDatasetLoaderTest, ADeadShardIsReadOnceAndAGoodOneCarriesTheRun) {
  config_.num_streams = 1;
  config_.skip_bad_shards = true;
  const std::string opened = dir_ / "opened";
  config_.urls = {dir_ / "shard-000.tar", "pipe:echo >> " + opened + "; exit 1"};
  std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
  std::vector<int32_t> inputs(80 * kSeqLen), targets(80 * kSeqLen);
  ::testing::internal::CaptureStderr();
  const absl::Status status = loader->Next(80, inputs.data(), targets.data());
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(status.ok()) << status << "\n" << log;
  EXPECT_EQ(testing::ReadFile(opened), "\n") << "the dead shard's command ran more than once";
  EXPECT_GE(loader->shard_counts().skipped, 2);  // each pass skips it
  EXPECT_TRUE(absl::StrContains(log, "without reading it for 10m")) << log;
  for (const int32_t token : inputs) EXPECT_TRUE(token == 0 || token / 1000 == 0) << token;
}

// A shard skipped unread is read again before the stream gives up: shard A fails once and is
// then skipped unread; when shard B fails too, every shard looks failed, but A, read again,
// has come back. (Counted as failed, A's skip ended the run.)
TEST_F(WebDatasetLoaderTest, ShardsSkippedUnreadAreReadAgainBeforeTheStreamGivesUp) {
  config_.num_streams = 1;
  config_.shard_shuffle = false;
  config_.skip_bad_shards = true;
  const std::string a_failed = dir_ / "a_failed", b_reads = dir_ / "b_reads";
  config_.urls = {"pipe:if [ -e " + a_failed + " ]; then cat " + (dir_ / "shard-001.tar") +
                      "; else touch " + a_failed + "; exit 1; fi",
                  "pipe:n=$(cat " + b_reads + " 2>/dev/null || echo 0); echo $((n + 1)) > " +
                      b_reads + "; [ $n -eq 1 ] && exit 1; cat " + (dir_ / "shard-000.tar")};
  std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
  std::vector<int32_t> inputs(80 * kSeqLen), targets(80 * kSeqLen);
  ::testing::internal::CaptureStderr();
  const absl::Status status = loader->Next(80, inputs.data(), targets.data());
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(status.ok()) << status << "\n" << log;
  EXPECT_TRUE(absl::c_any_of(inputs, [](int32_t token) { return token / 1000 == 1; }))
      << "shard A never came back";
}

// Streams that never reach a good shard end with the error rather than loop: unshuffled, stream
// 1 of 2 reads only the second of two shards.
TEST_F(WebDatasetLoaderTest, AStreamWhoseShardsAllFailSaysSoThoughOthersRead) {
  config_.num_streams = 2;
  config_.shard_shuffle = false;
  config_.skip_bad_shards = true;
  config_.urls = {dir_ / "shard-000.tar", dir_ / "missing.tar"};
  std::vector<int32_t> inputs(8 * kSeqLen), targets(8 * kSeqLen);
  ::testing::internal::CaptureStderr();
  const absl::Status status = Loader(0, 1)->Next(8, inputs.data(), targets.data());
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(
      status.message(), "data stream 1: every shard it reads (1) failed before its first token"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "missing.tar")) << status;
}

// With more streams than the passes have shards, a stream without a shard of its own says so,
// where it said it had finished its passes "after 0 windows".
TEST_F(WebDatasetLoaderTest, AStreamWithoutAShardInThePassesSaysSo) {
  config_.num_streams = 8;
  config_.epochs = 1;
  std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
  std::vector<int32_t> inputs(16 * kSeqLen), targets(16 * kSeqLen);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(loader->Next(16, inputs.data(), targets.data()).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(
      log, "data stream 6 has no shard of its own in data.epochs = 1 passes over 6 shards"))
      << log;
  EXPECT_FALSE(absl::StrContains(log, "after 0 windows")) << log;
}

// A shard that fails ahead of the step ends the run at the next batch, not after the windows
// read before it (with a large data.read_ahead_mb, minutes of steps that no checkpoint keeps).
// The reader reads shard 0's windows ahead of the first batch, then fails on the missing shard 1.
TEST_F(WebDatasetLoaderTest, AShardThatFailsAheadFailsTheNextBatch) {
  config_.num_streams = 1;
  config_.shard_shuffle = false;
  config_.urls = {dir_ / "shard-000.tar", dir_ / "missing.tar"};
  std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
  std::vector<int32_t> inputs(kSeqLen), targets(kSeqLen);
  // On a loaded machine the reader may fail before the first batch is asked for, which then
  // fails; else the first succeeds and the next fails.
  absl::Status status = loader->Next(1, inputs.data(), targets.data());
  int batches = 0;  // before the failure
  for (; batches < 5 && status.ok(); ++batches) {
    absl::SleepFor(absl::Seconds(1));  // the reader's failure is queued within microseconds
    status = loader->Next(1, inputs.data(), targets.data());
  }
  EXPECT_TRUE(absl::StrContains(status.message(), "missing.tar")) << status;
  EXPECT_LE(batches, 1) << "the failure waited behind the windows read before it";
  EXPECT_EQ(loader->state().consumed_sequences, batches);
}

// A shard command that fails partway cut its archive: the error gives its exit status, where it
// said only that the archive was cut. A command still writing when its archive goes bad is not
// ended to ask (it would die of SIGPIPE, and that exit would stand for the archive's error).
TEST_F(WebDatasetLoaderTest, AFailedShardCommandIsNamedByItsExitStatus) {
  config_.urls[3] = "pipe:head -c 3000 " + (dir_ / "shard-003.tar") + "; exit 7";
  std::vector<int32_t> inputs(80 * kSeqLen), targets(80 * kSeqLen);
  absl::Status status = Loader(0, 1)->Next(80, inputs.data(), targets.data());
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "ended with exit code 7")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "reading its archive: ")) << status;

  std::string damaged = testing::ReadFile(dir_ / "shard-003.tar");
  const size_t first_size = std::stoul(damaged.substr(124, 11), nullptr, 8);
  damaged[512 + (first_size + 511) / 512 * 512] ^= 0x55;  // the second header's checksum fails
  testing::WriteFile(dir_ / "damaged.tar", damaged);
  config_.urls[3] = "pipe:cat " + (dir_ / "damaged.tar") + "; exec yes";
  status = Loader(0, 1)->Next(80, inputs.data(), targets.data());
  ASSERT_FALSE(status.ok());
  EXPECT_FALSE(absl::StrContains(status.message(), "shard command")) << status;
}

// A loader stopped while its reader waits on a slow shard command (to restore, or at the end of
// a run) cancels that wait: it neither waits the command out nor counts the shard as failed, so
// the restored order is the uninterrupted one even with skip_shard. Shard 0 gives 6 windows; the
// reader reads them ahead (the queue holds 8), then waits on the command.
TEST_F(WebDatasetLoaderTest, AStopCancelsAReadWaitingOnAShardCommand) {
  config_.num_streams = 1;
  config_.shard_shuffle = false;
  config_.skip_bad_shards = true;
  config_.urls = {dir_ / "shard-000.tar", "pipe:sleep 3; cat " + (dir_ / "shard-001.tar")};
  std::vector<int32_t> inputs(8 * kSeqLen), targets(8 * kSeqLen);
  ASSERT_TRUE(Loader(0, 1)->Next(8, inputs.data(), targets.data()).ok());

  std::unique_ptr<WebDatasetLoader> loader = Loader(0, 1);
  std::vector<int32_t> resumed_inputs(8 * kSeqLen), resumed_targets(8 * kSeqLen);
  ASSERT_TRUE(loader->Next(1, resumed_inputs.data(), resumed_targets.data()).ok());
  absl::SleepFor(absl::Milliseconds(300));
  absl::Time start = absl::Now();
  ASSERT_TRUE(loader->Restore(loader->state()).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the restore waited out the command";
  ASSERT_TRUE(
      loader->Next(7, resumed_inputs.data() + kSeqLen, resumed_targets.data() + kSeqLen).ok());
  EXPECT_EQ(resumed_inputs, inputs);
  EXPECT_EQ(resumed_targets, targets);
  EXPECT_EQ(loader->shard_counts().skipped, 0);

  loader = Loader(0, 1);
  ASSERT_TRUE(loader->Next(1, inputs.data(), targets.data()).ok());
  absl::SleepFor(absl::Milliseconds(300));
  start = absl::Now();
  loader.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the loader's end waited out the command";
}

TEST_F(WebDatasetLoaderTest, ValidationReadsShardsInOrderTheSameEveryTime) {
  StreamConfig val = config_;
  val.urls = {dir_ / "shard-000.tar"};
  val.num_streams = 1;
  val.shard_shuffle = false;
  val.block_samples = 1;
  val.epochs = 1;
  val.finite = true;
  WebDatasetValidationLoader loader(val, 0, 1);
  // Shard 0: docs of 1..5 tokens + EOS = 2+3+4+5+6+2+3 = 25 tokens -> (25 - 1) / 4 = 6 windows.
  std::vector<int32_t> inputs(4 * kSeqLen), targets(4 * kSeqLen);
  EXPECT_EQ(*loader.Next(4, inputs.data(), targets.data()), 4);
  EXPECT_EQ(inputs[0], 0);
  EXPECT_EQ(inputs[1], 0);  // doc 0 = [0], then EOS 0
  EXPECT_EQ(inputs[2], 1);
  EXPECT_EQ(*loader.Next(4, inputs.data(), targets.data()), 2);
  EXPECT_EQ(*loader.Next(4, inputs.data(), targets.data()), 0);
  loader.Reset();
  EXPECT_EQ(*loader.Next(4, inputs.data(), targets.data()), 4);
  EXPECT_EQ(inputs[2], 1);
}

}  // namespace
}  // namespace dtrain
