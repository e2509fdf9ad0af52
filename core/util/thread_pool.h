// The one thread pool: a fixed set of workers that run ParallelFor loops. The calling thread
// takes part, so a pool of size 1 runs everything inline. Not reentrant: a ParallelFor body
// must not call ParallelFor on the same pool.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dtrain {

// The CPUs this process may run on (its affinity mask: taskset, a Slurm task's cores, a
// container's cpuset), at least 1.
int UsableCpus();

// The most threads a pool (run.threads, --threads) may ask for: above any machine's CPUs, below
// what exhausts a process's threads.
inline constexpr int kMaxThreads = 4096;

class ThreadPool {
 public:
  // num_threads <= 0 means UsableCpus().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into at most size() contiguous chunks of at least `grain` items and calls
  // body(begin, end, thread_index) for each; returns when all are done.
  void ParallelFor(size_t n, size_t grain,
                   const std::function<void(size_t begin, size_t end, int thread)>& body);

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(size_t, size_t, int)>* body_ = nullptr;
  size_t n_ = 0;
  size_t chunk_ = 0;
  int chunks_ = 0;
  int next_chunk_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace dtrain
