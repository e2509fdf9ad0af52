// Token plus position embedding: forward one thread per 16-byte pack of an output row; backward
// sorts the ids with their rows, then one thread per (run of an id, column) (position table
// without documents: per position and column); arithmetic in embedding_math.h.
#include <cub/device/device_radix_sort.cuh>

#include "core/backend/cuda/embedding_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/pack.cuh"
#include "core/backend/cuda/positions_math.h"

namespace dtrain::cuda {
namespace {

// Grid: RowPackGrid over the B*T rows.
template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const T* token_embedding,
                                       const T* position_embedding, const int32_t* positions, int t,
                                       int c, int vocab_begin, int vocab_end) {
  const size_t row = RowOfGrid();
  const size_t j = PackOfRow<T>();
  if (j >= static_cast<size_t>(c)) return;
  const T* wte = TokenRow(token_embedding, tokens[row], c, vocab_begin, vocab_end);
  const T* wpe =
      position_embedding == nullptr
          ? nullptr
          : position_embedding + static_cast<size_t>(TokenPosition(positions, row, t)) * c;
  Pack<T> token_values, position_values, y;
  if (wte != nullptr) token_values = LoadPack(wte, j, c, T{});
  if (wpe != nullptr) position_values = LoadPack(wpe, j, c, T{});
  for (int k = 0; k < kPackSize<T>; ++k) {
    y.values[k] = EmbeddingValue(wte == nullptr ? nullptr : &token_values.values[k],
                                 wpe == nullptr ? nullptr : &position_values.values[k]);
  }
  StorePack(out + row * c, j, c, y);
}

template <typename T>
__global__ void PositionEmbeddingGradKernel(float* dposition_embedding, const T* dout, int b, int t,
                                            int c) {
  const size_t index = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<size_t>(t) * c) return;
  PositionEmbeddingGrad(dposition_embedding, dout, b, t, c, static_cast<int>(index / c),
                        static_cast<int>(index % c));
}

__global__ void RowIndicesKernel(int32_t* rows, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) rows[i] = static_cast<int32_t>(i);
}

// Grid: (count sorted positions, column blocks); a block whose position starts no run returns.
// The others find where their run ends together, blockDim.x positions a pass, then each thread
// adds its column of the run.
template <typename T>
__global__ void EmbeddingGradRunKernel(float* dtable, const T* dout, const int32_t* sorted_ids,
                                       const int32_t* sorted_rows, size_t count, int c,
                                       int id_begin, int id_end) {
  const size_t i = blockIdx.x;
  if (!StartsRun(sorted_ids, i)) return;  // the whole block
  __shared__ size_t end;
  for (size_t k = i + 1 + threadIdx.x;; k += blockDim.x) {
    if (RunEndsAt(sorted_ids, count, i, k)) end = k;  // one thread of one pass
    if (__syncthreads_or(PastRun(sorted_ids, count, i, k))) break;
  }
  const int j = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (j < c)
    EmbeddingGradRun(dtable, dout, sorted_ids, sorted_rows, i, end, c, id_begin, id_end, j);
}

unsigned Blocks(size_t threads) {
  return static_cast<unsigned>((threads + kElementwiseThreads - 1) / kElementwiseThreads);
}

// The scratch of EmbeddingBackward: the sorted ids, the row indices and the sorted rows (count
// each), then CUB's temporary storage, each 256-byte aligned.
struct SortScratch {
  int32_t* sorted_ids;
  int32_t* rows;
  int32_t* sorted_rows;
  void* temp;
  size_t temp_bytes;
};
constexpr size_t kAlign = 256;
size_t Aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
size_t SortTempBytes(size_t count) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(count));
  return bytes;
}
SortScratch LayOut(void* scratch, size_t count) {
  char* at = static_cast<char*>(scratch);
  const size_t ids_bytes = Aligned(count * sizeof(int32_t));
  return {.sorted_ids = reinterpret_cast<int32_t*>(at),
          .rows = reinterpret_cast<int32_t*>(at + ids_bytes),
          .sorted_rows = reinterpret_cast<int32_t*>(at + 2 * ids_bytes),
          .temp = at + 3 * ids_bytes,
          .temp_bytes = SortTempBytes(count)};
}

// dtable += dout's rows, row r into ids[r]'s table row (embedding_math.h); the sort's error, if
// it failed to start.
template <typename T>
cudaError_t TableGrad(float* dtable, const T* dout, const int32_t* ids, size_t count, int c,
                      int id_begin, int id_end, const SortScratch& sort, cudaStream_t stream) {
  RowIndicesKernel<<<Blocks(count), kElementwiseThreads, 0, stream>>>(sort.rows, count);
  size_t temp_bytes = sort.temp_bytes;
  // Stable: an id's rows stay in row order.
  const cudaError_t sorted = cub::DeviceRadixSort::SortPairs(
      sort.temp, temp_bytes, ids, sort.sorted_ids, sort.rows, sort.sorted_rows,
      static_cast<int>(count), 0, static_cast<int>(sizeof(int32_t) * 8), stream);
  if (sorted != cudaSuccess) return sorted;
  const dim3 grid(static_cast<unsigned>(count), Blocks(static_cast<size_t>(c)));
  EmbeddingGradRunKernel<<<grid, kElementwiseThreads, 0, stream>>>(
      dtable, dout, sort.sorted_ids, sort.sorted_rows, count, c, id_begin, id_end);
  return cudaSuccess;
}

}  // namespace

size_t EmbeddingBackwardScratchBytes(size_t rows) {
  return 3 * Aligned(rows * sizeof(int32_t)) + SortTempBytes(rows);
}

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* token_embedding,
                      const T* position_embedding, int b, int t, int c, int vocab_begin,
                      int vocab_end, const int32_t* positions, cudaStream_t stream) {
  if (b == 0 || t == 0 || c == 0) return;
  const dim3 grid = RowPackGrid<T>(static_cast<size_t>(b) * t, c);
  EmbeddingForwardKernel<<<grid, kElementwiseThreads, 0, stream>>>(
      out, tokens, token_embedding, position_embedding, positions, t, c, vocab_begin, vocab_end);
}

template <typename T>
cudaError_t EmbeddingBackward(float* dtoken_embedding, float* dposition_embedding, const T* dout,
                              const int32_t* tokens, int b, int t, int c, int vocab_begin,
                              int vocab_end, const int32_t* positions, void* scratch,
                              cudaStream_t stream) {
  if (b == 0 || t == 0 || c == 0) return cudaSuccess;
  const size_t rows = static_cast<size_t>(b) * t;
  const SortScratch sort = LayOut(scratch, rows);
  const cudaError_t tokens_sorted =
      TableGrad(dtoken_embedding, dout, tokens, rows, c, vocab_begin, vocab_end, sort, stream);
  if (tokens_sorted != cudaSuccess || dposition_embedding == nullptr) return tokens_sorted;
  if (positions != nullptr) {
    return TableGrad(dposition_embedding, dout, positions, rows, c, 0, t, sort, stream);
  }
  PositionEmbeddingGradKernel<<<Blocks(static_cast<size_t>(t) * c), kElementwiseThreads, 0,
                                stream>>>(dposition_embedding, dout, b, t, c);
  return cudaSuccess;
}

#define DTRAIN_INSTANTIATE(T)                                                                   \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int, \
                                    int, const int32_t*, cudaStream_t);                         \
  template cudaError_t EmbeddingBackward<T>(float*, float*, const T*, const int32_t*, int, int, \
                                            int, int, int, const int32_t*, void*, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
