#include "core/data/window_loader.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

constexpr int kSeqLen = 4;

// Token i has value i, so a window is identified by its first input token.
std::vector<int32_t> Iota(int n) {
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  return tokens;
}

std::unique_ptr<ShuffledWindowLoader> MakeTrain(int num_tokens, uint64_t seed, int global_batch,
                                                int rank = 0, int world = 1) {
  absl::StatusOr<std::unique_ptr<ShuffledWindowLoader>> loader = ShuffledWindowLoader::Create(
      Iota(num_tokens), kSeqLen, seed, global_batch, rank, world, "test tokens");
  EXPECT_TRUE(loader.ok()) << loader.status();
  return std::move(loader).value();
}

// Reads `count` sequences and returns their window indices, checking targets = inputs + 1.
std::vector<int64_t> ReadWindows(SequenceLoader& loader, int count) {
  std::vector<int32_t> inputs(count * kSeqLen), targets(count * kSeqLen);
  EXPECT_TRUE(loader.Next(count, inputs.data(), targets.data()).ok());
  std::vector<int64_t> windows;
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(inputs[i * kSeqLen] % kSeqLen, 0);
    for (int t = 0; t < kSeqLen; ++t) {
      EXPECT_EQ(inputs[i * kSeqLen + t], inputs[i * kSeqLen] + t);
      EXPECT_EQ(targets[i * kSeqLen + t], inputs[i * kSeqLen + t] + 1);
    }
    windows.push_back(inputs[i * kSeqLen] / kSeqLen);
  }
  return windows;
}

TEST(ShuffledWindowLoaderTest, WindowsStrideSeqLenSoEveryTokenIsATarget) {
  // 23 tokens: (23 - 1) / 4 = 5 windows; tokens 1..20 are targets, 21 and 22 never are.
  auto loader = MakeTrain(23, 1, 5);
  EXPECT_EQ(loader->num_windows(), 5);
  std::vector<int64_t> windows = ReadWindows(*loader, 5);
  std::sort(windows.begin(), windows.end());
  EXPECT_EQ(windows, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(ShuffledWindowLoaderTest, EveryWindowOncePerEpochInANewOrderEachEpoch) {
  auto loader = MakeTrain(401, 7, 4);  // 100 windows
  const std::vector<int64_t> epoch0 = ReadWindows(*loader, 100);
  const std::vector<int64_t> epoch1 = ReadWindows(*loader, 100);
  EXPECT_NE(epoch0, epoch1);
  for (std::vector<int64_t> epoch : {epoch0, epoch1}) {
    std::sort(epoch.begin(), epoch.end());
    std::vector<int64_t> all(100);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(epoch, all);
  }
}

TEST(ShuffledWindowLoaderTest, SameSeedSameOrderOtherSeedOtherOrder) {
  auto a = MakeTrain(401, 7, 4), b = MakeTrain(401, 7, 4), c = MakeTrain(401, 8, 4);
  const std::vector<int64_t> from_a = ReadWindows(*a, 150);
  EXPECT_EQ(from_a, ReadWindows(*b, 150));
  EXPECT_NE(from_a, ReadWindows(*c, 150));
}

TEST(ShuffledWindowLoaderTest, RestoreMidEpochContinuesExactly) {
  auto original = MakeTrain(401, 7, 4);
  ReadWindows(*original, 37);
  const LoaderState state = original->state();
  EXPECT_EQ(state.consumed_sequences, 37);
  const std::vector<int64_t> expected = ReadWindows(*original, 120);

  auto resumed = MakeTrain(401, 7, 4);
  ReadWindows(*resumed, 3);  // any position before; Restore overrides it
  ASSERT_TRUE(resumed->Restore(state).ok());
  EXPECT_EQ(ReadWindows(*resumed, 120), expected);
}

// The sequences of each step, per rank, read in micro-batches.
std::vector<std::vector<int64_t>> StepsOfRank(int rank, int world, int global_batch,
                                              int micro_batch, int steps,
                                              const LoaderState& start = {}) {
  auto loader = MakeTrain(401, 3, global_batch, rank, world);
  EXPECT_TRUE(loader->Restore(start).ok());
  std::vector<std::vector<int64_t>> result;
  for (int s = 0; s < steps; ++s) {
    std::vector<int64_t> step;
    for (int m = 0; m < global_batch / world / micro_batch; ++m) {
      const std::vector<int64_t> part = ReadWindows(*loader, micro_batch);
      step.insert(step.end(), part.begin(), part.end());
    }
    result.push_back(step);
  }
  EXPECT_EQ(loader->state().consumed_sequences, start.consumed_sequences + steps * global_batch);
  return result;
}

TEST(ShuffledWindowLoaderTest, RanksTogetherReadTheSingleProcessStep) {
  const int global_batch = 8, steps = 30;  // 240 sequences: crosses two epoch ends
  const std::vector<std::vector<int64_t>> single = StepsOfRank(0, 1, global_batch, 8, steps);
  for (int world : {2, 4}) {
    std::vector<std::vector<std::vector<int64_t>>> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(StepsOfRank(r, world, global_batch, 2, steps));
    for (int s = 0; s < steps; ++s) {
      std::vector<int64_t> combined;
      for (int r = 0; r < world; ++r) {
        combined.insert(combined.end(), ranks[r][s].begin(), ranks[r][s].end());
      }
      EXPECT_EQ(combined, single[s]) << "world " << world << " step " << s;
    }
  }
}

TEST(ShuffledWindowLoaderTest, ResumesOnAnotherWorldSizeAtAStepBoundary) {
  const std::vector<std::vector<int64_t>> single = StepsOfRank(0, 1, 8, 4, 5);
  const LoaderState after_three_steps{3 * 8};
  std::vector<int64_t> step3;
  for (int r = 0; r < 4; ++r) {
    const std::vector<int64_t> part = StepsOfRank(r, 4, 8, 1, 1, after_three_steps)[0];
    step3.insert(step3.end(), part.begin(), part.end());
  }
  EXPECT_EQ(step3, single[3]);
}

// A run resumed with another batch size on other ranks reads on from the first unread sequence:
// 160 sequences in steps of 8, then steps of 12 over 2 ranks (160 is no multiple of 12 or of
// its 6 a rank), as one process reading them in order does.
TEST(ShuffledWindowLoaderTest, ResumesWithAnotherBatchSizeAtTheNextUnreadSequence) {
  auto single = MakeTrain(401, 3, 4);
  const std::vector<int64_t> in_order = ReadWindows(*single, 160 + 2 * 12);
  const LoaderState consumed{160};
  for (int step = 0; step < 2; ++step) {
    std::vector<int64_t> combined;
    for (int r = 0; r < 2; ++r) {
      const std::vector<int64_t> part = StepsOfRank(r, 2, 12, 3, 2, consumed)[step];
      combined.insert(combined.end(), part.begin(), part.end());
    }
    EXPECT_EQ(combined, std::vector<int64_t>(in_order.begin() + 160 + step * 12,
                                             in_order.begin() + 160 + (step + 1) * 12))
        << "step " << step;
  }
}

TEST(ShuffledWindowLoaderTest, RejectsBadArguments) {
  EXPECT_TRUE(absl::StrContains(
      ShuffledWindowLoader::Create(Iota(4), kSeqLen, 1, 4, 0, 1, "tiny").status().message(),
      "tiny: 4 tokens is fewer than one window of train.seq_len + 1 = 5"));
  EXPECT_TRUE(absl::StrContains(
      ShuffledWindowLoader::Create(Iota(40), kSeqLen, 1, 6, 0, 4, "x").status().message(),
      "train.batch_size 6 is not a positive multiple of the 4 data-parallel ranks"));
  auto loader = MakeTrain(40, 1, 4, 0, 2);
  EXPECT_TRUE(absl::StrContains(loader->Restore({-3}).message(), "-3 consumed sequences"));
}

TEST(SequentialWindowLoaderTest, ReadsWindowsInOrderSplitAcrossRanksAndResets) {
  // 7 windows; two ranks reading 2 rows per call.
  std::vector<std::unique_ptr<SequentialWindowLoader>> ranks;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<SequentialWindowLoader>> loader =
        SequentialWindowLoader::Create(Iota(29), kSeqLen, r, 2, "val");
    ASSERT_TRUE(loader.ok()) << loader.status();
    ranks.push_back(std::move(loader).value());
  }
  EXPECT_EQ(ranks[0]->num_windows(), 7);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<int32_t> inputs(2 * kSeqLen), targets(2 * kSeqLen);
    std::vector<int> rows;
    std::vector<int32_t> firsts;
    for (int call = 0; call < 3; ++call) {
      for (auto& loader : ranks) {
        absl::StatusOr<int> n = loader->Next(2, inputs.data(), targets.data());
        ASSERT_TRUE(n.ok());
        rows.push_back(*n);
        for (int i = 0; i < *n; ++i) {
          firsts.push_back(inputs[i * kSeqLen]);
          EXPECT_EQ(targets[i * kSeqLen + kSeqLen - 1], inputs[i * kSeqLen] + kSeqLen);
        }
      }
    }
    EXPECT_EQ(rows, (std::vector<int>{2, 2, 2, 1, 0, 0}));
    EXPECT_EQ(firsts, (std::vector<int32_t>{0, 4, 8, 12, 16, 20, 24}));
    for (auto& loader : ranks) loader->Reset();
  }
}

// Ended answers alike on every rank, after the call that reads the set's last window (where a
// rank's own share may have ended a call earlier), at every world size.
TEST(SequentialWindowLoaderTest, EveryRankSeesTheSetEndAtTheSameCall) {
  for (int world = 1; world <= 3; ++world) {
    std::vector<std::unique_ptr<SequentialWindowLoader>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(SequentialWindowLoader::Create(Iota(29), kSeqLen, r, world, "val").value());
    }
    std::vector<int32_t> inputs(2 * kSeqLen), targets(2 * kSeqLen);
    int calls = 0, rows = 0;
    while (!ranks[0]->Ended().value()) {
      for (auto& loader : ranks) {
        EXPECT_FALSE(loader->Ended().value()) << "world " << world << " call " << calls;
        rows += loader->Next(2, inputs.data(), targets.data()).value();
      }
      ++calls;
    }
    for (auto& loader : ranks) EXPECT_TRUE(loader->Ended().value()) << "world " << world;
    EXPECT_EQ(rows, 7) << "world " << world;                                   // every window once
    EXPECT_EQ(calls, (7 + 2 * world - 1) / (2 * world)) << "world " << world;  // no empty call
  }
}

}  // namespace
}  // namespace dtrain
