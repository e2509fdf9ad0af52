#include "core/util/thread_pool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

// Runs one loop and checks every index ran exactly once, chunks had at least `grain` items
// (except when n itself is smaller), and thread indices were in range.
void ExpectCoversOnce(ThreadPool& pool, size_t n, size_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::mutex mu;
  std::vector<size_t> chunk_sizes;
  pool.ParallelFor(n, grain, [&](size_t begin, size_t end, int thread) {
    EXPECT_GE(thread, 0);
    EXPECT_LT(thread, pool.size());
    for (size_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    chunk_sizes.push_back(end - begin);
  });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  EXPECT_LE(chunk_sizes.size(), static_cast<size_t>(pool.size()));
  for (size_t size : chunk_sizes) EXPECT_GE(size, std::min(n, grain));
}

TEST(ThreadPoolTest, CoversEveryIndexOnceForSmallAndOddSizes) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t n : {0, 1, 2, 3, 7, 13, 100, 1001}) {
      for (size_t grain : {0, 1, 5, 64}) ExpectCoversOnce(pool, n, grain);
    }
  }
}

TEST(ThreadPoolTest, ZeroItemsNeverCallsTheBody) {
  ThreadPool pool(3);
  bool called = false;
  pool.ParallelFor(0, 1, [&](size_t, size_t, int) { called = true; });
  EXPECT_FALSE(called);
}

// Four chunks on a pool of four run at the same time, on four threads: each chunk waits until
// all four have started, which a pool that ran them one after another never reaches (the waits
// give up 60 s after the start, a generous cap, so that such a pool fails instead of hanging).
TEST(ThreadPoolTest, SplitsWorkAcrossThreads) {
  ThreadPool pool(4);
  std::mutex mu;
  std::condition_variable all_started;
  int started = 0;
  std::set<std::thread::id> os_threads;
  std::set<int> thread_indices;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pool.ParallelFor(4, 1, [&](size_t begin, size_t end, int thread) {
    EXPECT_EQ(end - begin, 1u);
    std::unique_lock<std::mutex> lock(mu);
    os_threads.insert(std::this_thread::get_id());
    thread_indices.insert(thread);
    ++started;
    all_started.notify_all();
    EXPECT_TRUE(all_started.wait_until(lock, deadline, [&] { return started == 4; }))
        << "chunk " << begin << " ran while only " << started << " of 4 had started";
  });
  EXPECT_EQ(os_threads.size(), 4u);
  EXPECT_EQ(thread_indices, (std::set<int>{0, 1, 2, 3}));
}

TEST(ThreadPoolTest, ManyCallsInARow) {
  ThreadPool pool(3);
  std::atomic<long> sum{0};
  for (int call = 0; call < 2000; ++call) {
    const size_t n = 1 + call % 17;
    pool.ParallelFor(n, 1, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) sum.fetch_add(static_cast<long>(i));
    });
  }
  long expected = 0;
  for (int call = 0; call < 2000; ++call) {
    const long n = 1 + call % 17;
    expected += n * (n - 1) / 2;
  }
  EXPECT_EQ(sum.load(), expected);
}

// Size 0 is the CPUs the process may run on: restricted to one (taskset, a Slurm task's core)
// it runs one thread, where hardware_concurrency() counted every core of the machine.
TEST(ThreadPoolTest, NonPositiveSizeUsesTheCpusThisProcessMayRunOn) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(ThreadPool(0).size(), CPU_COUNT(&all));
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), 1);
  ExpectCoversOnce(pool, 97, 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
}

}  // namespace
}  // namespace dtrain
