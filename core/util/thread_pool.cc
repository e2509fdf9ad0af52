#include "core/util/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace dtrain {

int UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = UsableCpus();
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

// Claims chunks of the current loop until none is left. Called with `lock` held; the body runs
// unlocked so chunks proceed in parallel.
static void RunChunks(std::unique_lock<std::mutex>& lock,
                      const std::function<void(size_t, size_t, int)>* body, size_t n, size_t chunk,
                      int chunks, int& next_chunk, int& pending, std::condition_variable& done,
                      int thread) {
  while (next_chunk < chunks) {
    const size_t begin = static_cast<size_t>(next_chunk++) * chunk;
    const size_t end = std::min(n, begin + chunk);
    lock.unlock();
    (*body)(begin, end, thread);
    lock.lock();
    if (--pending == 0) done.notify_all();
  }
}

void ThreadPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(size_t, size_t, int)>& body) {
  if (n == 0) return;
  // Floor division keeps every chunk at least `grain` long.
  const size_t max_chunks =
      std::clamp<size_t>(n / std::max<size_t>(grain, 1), 1, static_cast<size_t>(size()));
  const size_t chunk = (n + max_chunks - 1) / max_chunks;
  const int chunks = static_cast<int>((n + chunk - 1) / chunk);
  if (chunks == 1) {
    body(0, n, 0);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  body_ = &body;
  n_ = n;
  chunk_ = chunk;
  chunks_ = chunks;
  next_chunk_ = 0;
  pending_ = chunks;
  ++generation_;
  work_ready_.notify_all();
  RunChunks(lock, body_, n_, chunk_, chunks_, next_chunk_, pending_, work_done_, 0);
  work_done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen_generation = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_ready_.wait(lock, [&] { return stop_ || generation_ != seen_generation; });
    if (stop_) return;
    seen_generation = generation_;
    RunChunks(lock, body_, n_, chunk_, chunks_, next_chunk_, pending_, work_done_, index);
  }
}

}  // namespace dtrain
