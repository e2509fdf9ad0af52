// Documents packed into a row (data.format sft) in the kernels: `positions` (B, T) holds each
// token's position in its own document, 0 at a document's first token and counting up by one
// within it (backend.h); null means one document per row. A document's rows are therefore
// consecutive: row t's document starts at t - positions[t] and ends before the next row whose
// position is 0. The CPU backend reads positions the same way (core/backend/cpu/*.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

// The position of token row `row` of the B*T rows: in its own document, or its time index.
DTRAIN_HD inline int TokenPosition(const int32_t* positions, size_t row, int time) {
  return positions != nullptr ? positions[row] : static_cast<int>(row % time);
}

// Rows [begin, end) of one batch row.
struct RowRange {
  int begin, end;
};

// The key rows query row t attends to: its document's rows up to t. `row_positions`: the batch
// row's T positions, or null.
DTRAIN_HD inline RowRange VisibleKeys(const int32_t* row_positions, int t) {
  return {row_positions != nullptr ? t - row_positions[t] : 0, t + 1};
}

// The query rows that attend to key row s: s and its document's later rows (of `time`). A row
// r > s is in s's document exactly when positions[r] == positions[s] + (r - s): true up to the
// document's end, false from there on (a later document restarts below that), so a binary
// search finds the end in log2(T) reads.
DTRAIN_HD inline RowRange VisibleQueries(const int32_t* row_positions, int time, int s) {
  if (row_positions == nullptr) return {s, time};
  int lo = s + 1, hi = time;  // the end is in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (row_positions[mid] == row_positions[s] + (mid - s)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return {s, lo};
}

// The rows of `range` within the run of rows [first, first + count): returns how many (<= 0 for
// none) and sets *offset to the first one's index in the run.
DTRAIN_HD inline int ClipToRun(const RowRange& range, int first, int count, int* offset) {
  const int begin = range.begin > first ? range.begin : first;
  const int end = range.end < first + count ? range.end : first + count;
  *offset = begin - first;
  return end - begin;
}

}  // namespace dtrain::cuda
