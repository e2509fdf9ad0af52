#include "parallel/comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/transport/tcp/address.h"
#include "parallel/comm/faulty_ranks.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/free_port.h"

namespace dtrain {
namespace {

// Small integers, so that every summation order gives the same float.
float Value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((rank * 7 + i * 3) % 11) - 5);
}

const std::vector<size_t> kCounts = {0, 1, 2, 3, 7, 1000, 300001};

class GlooCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectiveTest, AllReduceMatchesSequentialSum) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t count : kCounts) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = Value(comm.rank(), i);
        ASSERT_TRUE(comm.AllReduce(data.data(), count, op)->Wait().ok());
        for (size_t i = 0; i < count; ++i) {
          float expected = 0;
          for (int r = 0; r < n; ++r) expected += Value(r, i);
          if (op == ReduceOp::kAvg) expected /= static_cast<float>(n);
          ASSERT_EQ(data[i], expected) << "count " << count << " element " << i;
        }
      }
    }
  });
}

TEST_P(GlooCollectiveTest, ReduceScatterMatchesSequentialSum) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t count : kCounts) {
        std::vector<float> input(n * count);
        for (size_t i = 0; i < input.size(); ++i) input[i] = Value(comm.rank(), i);
        std::vector<float> output(count, -1.0f);
        ASSERT_TRUE(comm.ReduceScatter(input.data(), output.data(), count, op)->Wait().ok());
        for (size_t i = 0; i < count; ++i) {
          float expected = 0;
          for (int r = 0; r < n; ++r) expected += Value(r, comm.rank() * count + i);
          if (op == ReduceOp::kAvg) expected /= static_cast<float>(n);
          ASSERT_EQ(output[i], expected) << "count " << count << " element " << i;
        }
      }
    }
  });
}

TEST_P(GlooCollectiveTest, AllGatherConcatenatesInRankOrder) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    for (size_t count : kCounts) {
      std::vector<float> input(count);
      for (size_t i = 0; i < count; ++i) input[i] = Value(comm.rank(), i);
      std::vector<float> output(n * count, -100.0f);
      ASSERT_TRUE(comm.AllGather(input.data(), output.data(), count)->Wait().ok());
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(output[r * count + i], Value(r, i)) << "count " << count << " rank " << r;
        }
      }
    }
  });
}

TEST_P(GlooCollectiveTest, BroadcastFromEveryRoot) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    for (int root = 0; root < n; ++root) {
      for (size_t count : kCounts) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = Value(comm.rank(), i);
        ASSERT_TRUE(comm.Broadcast(data.data(), count, root)->Wait().ok());
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], Value(root, i)) << "root " << root;
      }
    }
  });
}

TEST_P(GlooCollectiveTest, SendAndRecvAroundTheRingWithoutDeadlock) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    const int right = (comm.rank() + 1) % n;
    const int left = (comm.rank() + n - 1) % n;
    for (size_t count : {size_t{1}, size_t{300001}}) {
      std::vector<float> out(count);
      for (size_t i = 0; i < count; ++i) out[i] = Value(comm.rank(), i);
      std::vector<float> in(count);
      // Every rank sends before it receives: a Send must not wait for the matching Recv.
      std::unique_ptr<Work> send = comm.Send(out.data(), count, right);
      std::unique_ptr<Work> recv = comm.Recv(in.data(), count, left);
      ASSERT_TRUE(send->Wait().ok());
      ASSERT_TRUE(recv->Wait().ok());
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], Value(left, i));
    }
    EXPECT_EQ(comm.stats().send.bytes_sent, (1 + 300001) * 4);
    EXPECT_EQ(comm.stats().recv.bytes_received, (1 + 300001) * 4);
  });
}

// Every data type there and back between neighbours, with everyone sending before receiving
// in both directions (a pipeline's activations forward, its gradients backward): the n-th send
// to a peer matches that peer's n-th receive, whatever the types in between. The counters hold
// the bytes each direction moved.
TEST_P(GlooCollectiveTest, TypedSendRecvRoundTripBothWays) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    const int r = comm.rank();
    const int right = (r + 1) % n;
    const int left = (r + n - 1) % n;
    const size_t count = 1001;
    std::vector<double> f64(count), f64_back(count), f64_in(count);
    std::vector<int64_t> i64(count), i64_in(count);
    std::vector<uint16_t> bf16(count), bf16_in(count);
    for (size_t i = 0; i < count; ++i) {
      f64[i] = r + i * 0.1;
      i64[i] = (int64_t{1} << 60) + r * 1000 + static_cast<int64_t>(i);
      bf16[i] = static_cast<uint16_t>(r * 7 + i);
    }
    std::vector<std::unique_ptr<Work>> works;
    // Forward: f64 then i64 to the right; backward: bf16 to the left. All sends first.
    works.push_back(comm.Send(f64.data(), count, right));
    works.push_back(comm.Send(i64.data(), count, right));
    works.push_back(comm.Send(bf16.data(), count, DataType::kBF16, left));
    works.push_back(comm.Recv(f64_in.data(), count, left));
    works.push_back(comm.Recv(i64_in.data(), count, left));
    works.push_back(comm.Recv(bf16_in.data(), count, DataType::kBF16, right));
    for (auto& work : works) ASSERT_TRUE(work->Wait().ok());
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(f64_in[i], left + i * 0.1);
      ASSERT_EQ(i64_in[i], (int64_t{1} << 60) + left * 1000 + static_cast<int64_t>(i));
      ASSERT_EQ(bf16_in[i], static_cast<uint16_t>(right * 7 + i));
    }
    // And back: what came from the left returns to it.
    std::unique_ptr<Work> send = comm.Send(f64_in.data(), count, left);
    std::unique_ptr<Work> recv = comm.Recv(f64_back.data(), count, right);
    ASSERT_TRUE(send->Wait().ok());
    ASSERT_TRUE(recv->Wait().ok());
    EXPECT_EQ(f64_back, f64);

    const CommStats stats = comm.stats();
    EXPECT_EQ(stats.send.calls, 4);
    EXPECT_EQ(stats.recv.calls, 4);
    EXPECT_EQ(stats.send.bytes_sent, static_cast<int64_t>(count * (8 + 8 + 2 + 8)));
    EXPECT_EQ(stats.recv.bytes_received, static_cast<int64_t>(count * (8 + 8 + 2 + 8)));
    EXPECT_EQ(stats.send.bytes_received, 0);
    EXPECT_EQ(stats.recv.bytes_sent, 0);
  });
}

// The bytes a ring moves: all-reduce sends every chunk but its own (reduce-scatter) and every
// chunk but its right neighbour's (all-gather) -> 2(n-1)/n of the buffer when it divides evenly.
TEST_P(GlooCollectiveTest, ByteCountersEqualTheRingTheory) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    const int r = comm.rank();
    const size_t count = 12 * 1000 + 1;  // not divisible by 2, 3 or 4
    std::vector<float> data(n * count, 1.0f);
    std::vector<float> out(n * count);
    ASSERT_TRUE(comm.AllReduce(data.data(), count, ReduceOp::kSum)->Wait().ok());
    ASSERT_TRUE(comm.ReduceScatter(data.data(), out.data(), count, ReduceOp::kSum)->Wait().ok());
    ASSERT_TRUE(comm.AllGather(data.data(), out.data(), count)->Wait().ok());
    ASSERT_TRUE(comm.Broadcast(data.data(), count, 1)->Wait().ok());
    const CommStats stats = comm.stats();

    auto chunk = [&](int c) {
      c = (c % n + n) % n;
      return static_cast<int64_t>(count / n + (static_cast<size_t>(c) < count % n ? 1 : 0));
    };
    const int64_t total = count;
    EXPECT_EQ(stats.all_reduce.calls, 1);
    EXPECT_EQ(stats.all_reduce.bytes_sent, 4 * ((total - chunk(r)) + (total - chunk(r + 1))));
    EXPECT_EQ(stats.all_reduce.bytes_received, 4 * ((total - chunk(r - 1)) + (total - chunk(r))));
    EXPECT_EQ(stats.reduce_scatter.bytes_sent, 4 * (n - 1) * total);
    EXPECT_EQ(stats.reduce_scatter.bytes_received, 4 * (n - 1) * total);
    EXPECT_EQ(stats.all_gather.bytes_sent, 4 * (n - 1) * total);
    EXPECT_EQ(stats.all_gather.bytes_received, 4 * (n - 1) * total);
    const int position = (r - 1 + n) % n;  // along the chain from root 1
    EXPECT_EQ(stats.broadcast.bytes_sent, position < n - 1 ? 4 * total : 0);
    EXPECT_EQ(stats.broadcast.bytes_received, position > 0 ? 4 * total : 0);

    // An evenly divisible all-reduce moves exactly 2(n-1)/n of the buffer each way.
    const size_t even = 12 * 1000;
    ASSERT_TRUE(comm.AllReduce(data.data(), even, ReduceOp::kSum)->Wait().ok());
    EXPECT_EQ(comm.stats().all_reduce.bytes_sent - stats.all_reduce.bytes_sent,
              static_cast<int64_t>(2 * (n - 1) * even * 4 / n));
  });
}

// Chunks above the 1 MiB segment limit are cut into several segments of unequal length (the
// counts above stay within two segments per chunk); every element must still arrive once.
TEST(GlooCommunicatorTest, CollectivesOverManySegmentsPerChunk) {
  testing::RunRanksInThreads(2, absl::Seconds(30), [](Communicator& comm) {
    const size_t count = 1600003;  // chunks of 800002 elements: 4 segments, the last shorter
    std::vector<float> data(2 * count);
    for (size_t i = 0; i < data.size(); ++i) data[i] = Value(comm.rank(), i);
    const std::vector<float> input = data;
    ASSERT_TRUE(comm.AllReduce(data.data(), count, ReduceOp::kSum)->Wait().ok());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], Value(0, i) + Value(1, i)) << i;

    std::vector<float> shard(count, -1.0f);
    ASSERT_TRUE(comm.ReduceScatter(input.data(), shard.data(), count, ReduceOp::kSum)->Wait().ok());
    for (size_t i = 0; i < count; ++i) {
      const size_t j = comm.rank() * count + i;
      ASSERT_EQ(shard[i], Value(0, j) + Value(1, j)) << i;
    }

    std::vector<float> root_data = input;
    ASSERT_TRUE(comm.Broadcast(root_data.data(), root_data.size(), 1)->Wait().ok());
    for (size_t i = 0; i < root_data.size(); ++i) ASSERT_EQ(root_data[i], Value(1, i)) << i;
  });
}

// Sums above 2^24 that float would round: int64 travels and adds as an integer. Beyond one
// segment (300001 x 8 bytes), so that the typed segment cuts agree between the ranks.
TEST_P(GlooCollectiveTest, Int64SumsAreExact) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    auto value = [](int rank, size_t i) {
      return (int64_t{1} << 40) + static_cast<int64_t>(i) * 3 - rank * 1000003;
    };
    for (size_t count : kCounts) {
      std::vector<int64_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i);
      ASSERT_TRUE(comm.AllReduce(data.data(), count, ReduceOp::kSum)->Wait().ok());
      std::vector<int64_t> input(n * count);
      for (size_t i = 0; i < input.size(); ++i) input[i] = value(comm.rank(), i);
      std::vector<int64_t> shard(count);
      ASSERT_TRUE(
          comm.ReduceScatter(input.data(), shard.data(), count, ReduceOp::kSum)->Wait().ok());
      for (size_t i = 0; i < count; ++i) {
        int64_t expected = 0;
        int64_t expected_shard = 0;
        for (int r = 0; r < n; ++r) {
          expected += value(r, i);
          expected_shard += value(r, comm.rank() * count + i);
        }
        ASSERT_EQ(data[i], expected) << "count " << count << " element " << i;
        ASSERT_EQ(shard[i], expected_shard) << "count " << count << " element " << i;
      }
    }
    EXPECT_EQ(comm.stats().all_reduce.bytes_sent % 8, 0);
  });
}

// Values 1 + k * 2^-40 are not floats; their sums and averages over up to 4 ranks are exact in
// double whatever the order, so they compare bit for bit.
TEST_P(GlooCollectiveTest, Float64ReducesInDouble) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    auto value = [](int rank, size_t i) {
      return 1.0 + static_cast<double>((rank * 7 + i) % 1000) * 0x1.0p-40;
    };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t count : kCounts) {
        std::vector<double> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i);
        ASSERT_TRUE(comm.AllReduce(data.data(), count, op)->Wait().ok());
        for (size_t i = 0; i < count; ++i) {
          double expected = 0;
          for (int r = 0; r < n; ++r) expected += value(r, i);
          if (op == ReduceOp::kAvg) expected /= n;
          ASSERT_EQ(data[i], expected) << "count " << count << " element " << i;
        }
      }
    }
  });
}

// 64-bit fingerprints, including words that read as float NaNs, arrive bit for bit.
TEST_P(GlooCollectiveTest, Uint64MovesBitForBit) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    auto value = [](int rank, size_t i) {
      return 0x7fc000017f800001ull * (static_cast<uint64_t>(rank) + 1) ^
             (i * 0x9e3779b97f4a7c15ull);
    };
    for (size_t count : kCounts) {
      for (int root = 0; root < n; ++root) {
        std::vector<uint64_t> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i);
        ASSERT_TRUE(comm.Broadcast(data.data(), count, root)->Wait().ok());
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], value(root, i)) << "root " << root;
      }
      std::vector<uint64_t> input(count);
      for (size_t i = 0; i < count; ++i) input[i] = value(comm.rank(), i);
      std::vector<uint64_t> all(n * count);
      ASSERT_TRUE(comm.AllGather(input.data(), all.data(), count)->Wait().ok());
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], value(r, i));
      }
    }
    const int right = (comm.rank() + 1) % n;
    const int left = (comm.rank() + n - 1) % n;
    const uint64_t out = value(comm.rank(), 0);
    uint64_t in = 0;
    std::unique_ptr<Work> send = comm.Send(&out, 1, right);
    std::unique_ptr<Work> recv = comm.Recv(&in, 1, left);
    ASSERT_TRUE(send->Wait().ok());
    ASSERT_TRUE(recv->Wait().ok());
    EXPECT_EQ(in, value(left, 0));
    EXPECT_EQ(comm.stats().send.bytes_sent, 8);
  });
}

// bfloat16 travels as its 2-byte bits and sums in float, rounding each partial sum: small
// integers are exact at every step.
TEST_P(GlooCollectiveTest, BFloat16ReducesInFloat) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    auto bits = [](float value) {
      return static_cast<uint16_t>(std::bit_cast<uint32_t>(value) >> 16);
    };
    for (size_t count : kCounts) {
      std::vector<uint16_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = bits(Value(comm.rank(), i));
      ASSERT_TRUE(comm.AllReduce(data.data(), count, DataType::kBF16, ReduceOp::kSum)->Wait().ok());
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int r = 0; r < n; ++r) expected += Value(r, i);
        ASSERT_EQ(data[i], bits(expected)) << "count " << count << " element " << i;
      }
    }
    const size_t count = 1000;
    std::vector<uint16_t> mine(count, bits(static_cast<float>(comm.rank())));
    std::vector<uint16_t> all(n * count);
    const CommStats before = comm.stats();
    ASSERT_TRUE(comm.AllGather(mine.data(), all.data(), count, DataType::kBF16)->Wait().ok());
    for (int r = 0; r < n; ++r) ASSERT_EQ(all[r * count], bits(static_cast<float>(r)));
    EXPECT_EQ(comm.stats().all_gather.bytes_sent - before.all_gather.bytes_sent,
              static_cast<int64_t>(2 * (n - 1) * count));
  });
}

// The maximum over ranks, for every type, through the all-reduce and the reduce-scatter: rank
// r's value at i is largest on the rank (i % n), negative values included, so a sum or a
// maximum of the wrong operands shows. Signed i64 must not compare as u64.
TEST_P(GlooCollectiveTest, MaxReducesToTheLargestValueOfEveryType) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    // -10 - i everywhere except on rank i % n, which holds i (rank 0 holds -0 at i = 0: max 0).
    auto value = [n](int rank, size_t i) {
      return rank == static_cast<int>(i % n) ? static_cast<double>(i) : -10.0 - i;
    };
    auto check = [&](auto zero) {
      using T = decltype(zero);
      for (size_t count : kCounts) {
        std::vector<T> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = static_cast<T>(value(comm.rank(), i));
        ASSERT_TRUE(comm.AllReduce(data.data(), count, ReduceOp::kMax)->Wait().ok());
        std::vector<T> input(n * count);
        for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<T>(value(comm.rank(), i));
        std::vector<T> shard(count);
        ASSERT_TRUE(
            comm.ReduceScatter(input.data(), shard.data(), count, ReduceOp::kMax)->Wait().ok());
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(data[i], static_cast<T>(i)) << "count " << count << " element " << i;
          ASSERT_EQ(shard[i], static_cast<T>(comm.rank() * count + i)) << "count " << count;
        }
      }
    };
    check(float{0});
    check(double{0});
    check(int64_t{0});
    // bf16 (a float's upper half) holds these small integers exactly.
    auto bits = [](double value) {
      return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(value)) >> 16);
    };
    std::vector<uint16_t> bf16(n);
    for (int i = 0; i < n; ++i) bf16[i] = bits(value(comm.rank(), i));
    ASSERT_TRUE(comm.AllReduce(bf16.data(), n, DataType::kBF16, ReduceOp::kMax)->Wait().ok());
    for (int i = 0; i < n; ++i) EXPECT_EQ(bf16[i], bits(i)) << "element " << i;
  });
}

TEST_P(GlooCollectiveTest, IntegerAverageIsRejectedAndTheCommunicatorStaysUsable) {
  const int n = GetParam();
  testing::RunRanksInThreads(n, absl::Seconds(20), [&](Communicator& comm) {
    std::vector<int64_t> data(10, 1);
    absl::Status status = comm.AllReduce(data.data(), data.size(), ReduceOp::kAvg)->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("all_reduce on group 'world': an average of i64"),
              std::string::npos)
        << status;
    std::vector<uint64_t> shard(10);
    std::vector<uint64_t> input(10 * n);
    EXPECT_EQ(comm.ReduceScatter(input.data(), shard.data(), 10, ReduceOp::kAvg)->Wait().code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(comm.AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait().ok());
    EXPECT_EQ(data[0], n);
    EXPECT_EQ(comm.stats().all_reduce.calls, 1);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectiveTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return absl::StrCat(info.param, "ranks"); });

TEST(GlooCommunicatorTest, SingleRankCollectivesAreLocal) {
  testing::RunRanksInThreads(1, absl::Seconds(5), [](Communicator& comm) {
    std::vector<float> data = {1, 2, 3};
    std::vector<float> out(3);
    EXPECT_TRUE(comm.AllReduce(data.data(), 3, ReduceOp::kAvg)->Wait().ok());
    EXPECT_TRUE(comm.ReduceScatter(data.data(), out.data(), 3, ReduceOp::kSum)->Wait().ok());
    EXPECT_TRUE(comm.AllGather(data.data(), out.data(), 3)->Wait().ok());
    EXPECT_TRUE(comm.Barrier().ok());
    EXPECT_EQ(out, data);
  });
}

TEST(GlooCommunicatorTest, OperationsRunInIssueOrderWhileTheCallerContinues) {
  testing::RunRanksInThreads(3, absl::Seconds(20), [](Communicator& comm) {
    // Buckets issued back to back and waited at the end, as the DDP engine does.
    std::vector<std::vector<float>> buckets(8, std::vector<float>(50000, 1.0f));
    std::vector<std::unique_ptr<Work>> works;
    for (auto& bucket : buckets) {
      works.push_back(comm.AllReduce(bucket.data(), bucket.size(), ReduceOp::kSum));
    }
    for (auto& work : works) ASSERT_TRUE(work->Wait().ok());
    for (auto& bucket : buckets) ASSERT_EQ(bucket.back(), 3.0f);
    EXPECT_TRUE(comm.Barrier().ok());
  });
}

TEST(GlooCommunicatorTest, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  const absl::Duration timeout = absl::Seconds(5);  // also the rendezvous', on a loaded machine
  std::atomic<int> failed{0};
  testing::RunRanksInThreads(3, timeout, [&](Communicator& comm) {
    std::vector<float> data(1000, 1.0f);
    ASSERT_TRUE(comm.AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait().ok());
    if (comm.rank() == 2) {
      // Stays alive but never issues the second all-reduce.
      while (failed.load() < 2) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    const absl::Time start = absl::Now();
    absl::Status status = comm.AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait();
    const absl::Duration elapsed = absl::Now() - start;
    failed.fetch_add(1);
    // Its own deadline, or (on a loaded machine, when the other waiting rank's deadline came
    // first and its failure closed their connection) the closed socket: rank 2 is named either way.
    EXPECT_TRUE(status.code() == absl::StatusCode::kDeadlineExceeded ||
                status.code() == absl::StatusCode::kUnavailable)
        << status;
    EXPECT_NE(status.message().find("all_reduce #2 on group 'world'"), std::string::npos) << status;
    EXPECT_NE(status.message().find("never started by rank 2 (last started #1)"), std::string::npos)
        << status;
    EXPECT_EQ(FaultyRanks(status), std::vector<int>{2}) << status;
    // Its own deadline not before the timeout (the other rank's can come first when that rank
    // started waiting earlier); after it, only a generous cap that a loaded machine cannot break.
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      EXPECT_GE(elapsed, timeout - absl::Milliseconds(50));
    }
    EXPECT_LT(elapsed, timeout + absl::Seconds(60));
    // The communicator is unusable afterwards and says so at once.
    absl::Status next = comm.AllReduce(data.data(), 1, ReduceOp::kSum)->Wait();
    EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition) << next;
    EXPECT_EQ(FaultyRanks(next), std::vector<int>{2}) << next;
  });
}

// In a group of two, a timed-out collective that both ranks started blames the peer: nothing
// else can hold it up. Here the ranks deadlock in different collectives of the same number
// (rank 0 all-reduces, rank 1 waits for rank 0's broadcast), as a rank stopped inside the
// operation also leaves it. The first rank whose wait runs out blames its peer; its failure
// closes the connection, which may end the other's wait first (Unavailable).
TEST(GlooCommunicatorTest, TwoRanksThatBothStartedBlameThePeer) {
  const absl::Duration timeout = absl::Seconds(2);
  std::atomic<int> timed_out{0};
  testing::RunRanksInThreads(2, timeout, [&](Communicator& comm) {
    std::vector<float> data(100, 1.0f);
    const absl::Status status =
        comm.rank() == 0 ? comm.AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait()
                         : comm.Broadcast(data.data(), data.size(), 0)->Wait();
    if (status.code() != absl::StatusCode::kDeadlineExceeded) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      return;
    }
    ++timed_out;
    const int peer = 1 - comm.rank();
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(
                    absl::StrCat("its one peer, rank ", peer, ", never completed its part")));
    EXPECT_EQ(FaultyRanks(status), std::vector<int>{peer}) << status;
  });
  EXPECT_GE(timed_out.load(), 1);
}

// A receive from a peer that never sends ends at the per-operation timeout, naming the peer and
// the group, blaming the peer (the launcher reports it as the root cause), counting no bytes,
// and leaving the communicator failed.
TEST(GlooCommunicatorTest, RecvFromAPeerThatNeverSendsTimesOutNamingIt) {
  const absl::Duration timeout = absl::Seconds(3);
  std::atomic<bool> done{false};
  testing::RunRanksInThreads(3, timeout, [&](Communicator& comm) {
    if (comm.rank() != 0) {
      // Alive, connected and silent until rank 0 has seen its failure.
      while (!done.load()) absl::SleepFor(absl::Milliseconds(10));
      return;
    }
    std::vector<float> data(100);
    const absl::Time start = absl::Now();
    const absl::Status status = comm.Recv(data.data(), data.size(), 2)->Wait();
    const absl::Duration elapsed = absl::Now() - start;
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr("recv of 400 bytes from rank 2 on group 'world'"));
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("timeout 3s"));
    EXPECT_EQ(FaultyRanks(status), std::vector<int>{2}) << status;
    // Not before the timeout; after it, only a generous cap that a loaded machine cannot break.
    EXPECT_GE(elapsed, timeout - absl::Milliseconds(50));
    EXPECT_LT(elapsed, timeout + absl::Seconds(60));
    EXPECT_EQ(comm.stats().recv.bytes_received, 0);
    EXPECT_EQ(comm.stats().recv.calls, 0);
    // Unusable afterwards, and it says so at once, blaming the same peer.
    const absl::Status next = comm.Send(data.data(), data.size(), 1)->Wait();
    EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition) << next;
    EXPECT_EQ(FaultyRanks(next), std::vector<int>{2}) << next;
    done.store(true);
  });
}

// Promptly: the closed sockets end the operation (Unavailable), not the timeout
// (DeadlineExceeded), which is long enough that no load on the machine reaches it.
TEST(GlooCommunicatorTest, RankWhoseConnectionsCloseIsNamedPromptly) {
  const absl::Duration timeout = absl::Seconds(120);
  testing::RunRanksInThreads(3, timeout, [&](Communicator& comm) {
    std::vector<float> data(100000, 1.0f);
    ASSERT_TRUE(comm.AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait().ok());
    if (comm.rank() == 2) return;  // destroys its communicator: its sockets close, as on exit
    absl::Status status = comm.AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_NE(status.message().find("rank 2 (last started #1)"), std::string::npos) << status;
  });
}

// Rank 1 joins (publishes its address) but never connects: nothing listens there, as with a
// rank that hung or whose host went away after joining. Rank 0's connection to it fails within
// the timeout (Gloo waited 5 times as long), naming and blaming rank 1 by the address Gloo's
// error names (it blamed nobody, and the agent named rank 0).
TEST(GlooCommunicatorTest, ARankThatJoinsAndNeverConnectsIsNamed) {
  auto store = std::make_shared<testing::InMemoryStore>();
  sockaddr_in nobody{};
  nobody.sin_family = AF_INET;
  nobody.sin_port = htons(static_cast<uint16_t>(testing::FreeTcpPort()));
  nobody.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::vector<char> published =
      gloo::transport::tcp::Address(reinterpret_cast<const sockaddr*>(&nobody), sizeof nobody)
          .bytes();  // rank 1's address for its connection with rank 0, its only peer
  ASSERT_TRUE(
      store->Set("comm/world/gloo/1", std::string(published.begin(), published.end())).ok());
  GlooCommunicatorOptions options;
  options.rank = 0;
  options.size = 2;
  options.world_ranks = {3, 5};
  options.timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  const absl::Status status = GlooCommunicator::Create(store, options).status();
  EXPECT_THAT(status.message(), ::testing::HasSubstr("the connection to rank(s) 5 failed"))
      << status;
  EXPECT_EQ(FaultyRanks(status), std::vector<int>{5});
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));  // the 2 s timeout, not 5 times it
}

// The connect's shorter Gloo timeout (a fifth, which Gloo waits 5 times) leaves the wait for a
// late peer's arrival its whole timeout: a rank 2 s late of 5 connects (the wait was 1 s).
TEST(GlooCommunicatorTest, APeerLateWithinTheTimeoutConnects) {
  auto store = std::make_shared<testing::InMemoryStore>();
  absl::Status status[2];
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      if (rank == 1) absl::SleepFor(absl::Seconds(2));
      GlooCommunicatorOptions options;
      options.rank = rank;
      options.size = 2;
      options.timeout = absl::Seconds(5);
      status[rank] = GlooCommunicator::Create(store, options).status();
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
}

TEST(GlooCommunicatorTest, RendezvousWithoutPeersFailsWithinTheTimeout) {
  auto store = std::make_shared<testing::InMemoryStore>();
  GlooCommunicatorOptions options;
  options.rank = 0;
  options.size = 2;
  options.world_ranks = {4, 6};
  options.timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm = GlooCommunicator::Create(store, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("rank 0 of 2"), std::string::npos) << comm.status();
  // The rank that never joined, by its world rank.
  EXPECT_EQ(FaultyRanks(comm.status()), std::vector<int>{6}) << comm.status();

  options.world_ranks = {4};
  EXPECT_EQ(GlooCommunicator::Create(store, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain
