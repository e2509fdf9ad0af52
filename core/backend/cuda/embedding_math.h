// Token plus position embedding, the CPU backend's arithmetic (core/backend/cpu/embedding.h):
// out (B*T, C) = token_embedding[token - vocab_begin] + position_embedding[position], a token
// outside the rank's rows [vocab_begin, vocab_end) looking up zeros, a null position table adding
// nothing; the position is t, or the token's position in its document (positions_math.h).
// Backward accumulates deterministically, without atomics: the rows are sorted by id (stably),
// and one thread owns an id's run in one column and adds its rows in order, as the CPU backend
// does, so repeated tokens (or, with documents, repeated positions) sum in the same order on
// every run. The gradient tables are float32 whatever dout's type (backend.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

// The token table's row for `token`, or null for a token outside [vocab_begin, vocab_end).
template <typename T>
DTRAIN_HD T* TokenRow(T* token_embedding, int32_t token, int c, int vocab_begin, int vocab_end) {
  if (token < vocab_begin || token >= vocab_end) return nullptr;
  return token_embedding + static_cast<size_t>(token - vocab_begin) * c;
}

// One output value from its token table value and position table value (either may be null).
template <typename T>
DTRAIN_HD T EmbeddingValue(const T* token_value, const T* position_value) {
  if (token_value == nullptr) return position_value == nullptr ? FromFloat<T>(0) : *position_value;
  if (position_value == nullptr) return *token_value;
  return FromFloat<T>(ToFloat(*token_value) + ToFloat(*position_value));
}

// Without documents: dposition_embedding[position, j] += dout[(batch, position), j] over the
// batches, in order.
template <typename T>
DTRAIN_HD void PositionEmbeddingGrad(float* dposition_embedding, const T* dout, int b, int t, int c,
                                     int position, int j) {
  float& grad = dposition_embedding[static_cast<size_t>(position) * c + j];
  for (int batch = 0; batch < b; ++batch) {
    grad += ToFloat(dout[(static_cast<size_t>(batch) * t + position) * c + j]);
  }
}

// A table's gradient dtable (id_end - id_begin, C) += dout's rows (B*T, C), row r into the
// table's row for ids[r]: the token table with the token ids, or the position table with the
// documents' positions (ids [0, T)). The ids come sorted, stably, with their row indices
// (sorted_ids and sorted_rows, `count` each), so that the rows of one id are a run, in row order.

// Whether sorted position i starts a run.
DTRAIN_HD inline bool StartsRun(const int32_t* sorted_ids, size_t i) {
  return i == 0 || sorted_ids[i] != sorted_ids[i - 1];
}

// Whether sorted position k (> i) lies past the run that starts at i.
DTRAIN_HD inline bool PastRun(const int32_t* sorted_ids, size_t count, size_t i, size_t k) {
  return k >= count || sorted_ids[k] != sorted_ids[i];
}

// Whether the run that starts at i ends at k (> i), its first position past the run. The ids are
// sorted, so exactly one k in (i, count] is: a block of threads, each testing one k, finds it in
// one pass over every blockDim.x positions of a long run.
DTRAIN_HD inline bool RunEndsAt(const int32_t* sorted_ids, size_t count, size_t i, size_t k) {
  return PastRun(sorted_ids, count, i, k) && (k - 1 == i || !PastRun(sorted_ids, count, i, k - 1));
}

// Rows whose loads one thread has in flight together while adding a run.
inline constexpr int kRunLoads = 8;

// For the run [begin, end) of sorted positions (StartsRun at begin, RunEndsAt end), column j of
// its id's table row += the run's dout rows in row order (nothing for an id outside
// [id_begin, id_end)). Each run has one owner and adds in row order as the CPU backend does:
// deterministic, without atomics, and the CPU's sums exactly. The loads of kRunLoads rows go out
// before their adds, so a frequent token's long run waits for memory once every kRunLoads rows;
// the sum lives in a register, which no load of dout (a float32 dout might alias the table)
// makes the compiler store and reload.
template <typename T>
DTRAIN_HD void EmbeddingGradRun(float* dtable, const T* dout, const int32_t* sorted_ids,
                                const int32_t* sorted_rows, size_t begin, size_t end, int c,
                                int id_begin, int id_end, int j) {
  float* grad_row = TokenRow(dtable, sorted_ids[begin], c, id_begin, id_end);
  if (grad_row == nullptr) return;
  const auto value = [&](size_t k) {
    return ToFloat(dout[static_cast<size_t>(sorted_rows[k]) * c + j]);
  };
  float grad = grad_row[j];
  size_t k = begin;
  for (; k + kRunLoads <= end; k += kRunLoads) {
    float values[kRunLoads];
    DTRAIN_UNROLL
    for (int q = 0; q < kRunLoads; ++q) values[q] = value(k + q);
    DTRAIN_UNROLL
    for (int q = 0; q < kRunLoads; ++q) grad += values[q];
  }
  for (; k < end; ++k) grad += value(k);
  grad_row[j] = grad;
}

}  // namespace dtrain::cuda
