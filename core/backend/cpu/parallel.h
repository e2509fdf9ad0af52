// How the CPU kernels run a loop: on a ThreadPool, or inline as one chunk when the pool is null
// (the serial path that the double-precision finite-difference tests take).
#pragma once

#include <cstddef>
#include <functional>

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

inline int NumThreads(const ThreadPool* pool) { return pool == nullptr ? 1 : pool->size(); }

// body(begin, end, thread) over [0, n) in contiguous chunks of at least `grain` items; `thread`
// is in [0, NumThreads(pool)) and indexes per-thread scratch.
inline void ParallelFor(ThreadPool* pool, size_t n, size_t grain,
                        const std::function<void(size_t, size_t, int)>& body) {
  if (pool != nullptr) {
    pool->ParallelFor(n, grain, body);
  } else if (n > 0) {
    body(0, n, 0);
  }
}

}  // namespace dtrain::cpu
