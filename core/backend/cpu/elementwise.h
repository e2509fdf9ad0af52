// Elementwise helpers over flat buffers of n values: add, scale, zero, and the sum of squares
// that gradient clipping needs. SumSquares accumulates in double over fixed 4096-value blocks
// and adds the block sums in order, so its result does not depend on the thread count.
#pragma once

#include <cstddef>

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

template <typename T>
void Add(T* out, const T* a, const T* b, size_t n, ThreadPool* pool);
template <typename T>
double SumSquares(const T* x, size_t n, ThreadPool* pool);
template <typename T>
void Scale(T* x, T factor, size_t n, ThreadPool* pool);
template <typename T>
void Zero(T* x, size_t n, ThreadPool* pool);

}  // namespace dtrain::cpu
