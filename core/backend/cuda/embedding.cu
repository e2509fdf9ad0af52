// Token plus position embedding: forward one thread per 16-byte pack of an output row, backward
// one thread per column (position table without documents: per position and column); arithmetic
// in embedding_math.h.
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
__global__ void PositionEmbeddingGradKernel(T* dposition_embedding, const T* dout, int b, int t,
                                            int c) {
  const size_t index = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<size_t>(t) * c) return;
  PositionEmbeddingGrad(dposition_embedding, dout, b, t, c, static_cast<int>(index / c),
                        static_cast<int>(index % c));
}

template <typename T>
__global__ void EmbeddingGradKernel(T* dtable, const T* dout, const int32_t* ids, size_t rows,
                                    int c, int id_begin, int id_end) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j < c) EmbeddingGradColumn(dtable, dout, ids, rows, c, id_begin, id_end, j);
}

unsigned Blocks(size_t threads) {
  return static_cast<unsigned>((threads + kElementwiseThreads - 1) / kElementwiseThreads);
}

}  // namespace

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
void EmbeddingBackward(T* dtoken_embedding, T* dposition_embedding, const T* dout,
                       const int32_t* tokens, int b, int t, int c, int vocab_begin, int vocab_end,
                       const int32_t* positions, cudaStream_t stream) {
  if (b == 0 || t == 0 || c == 0) return;
  const size_t rows = static_cast<size_t>(b) * t;
  EmbeddingGradKernel<<<Blocks(c), kElementwiseThreads, 0, stream>>>(
      dtoken_embedding, dout, tokens, rows, c, vocab_begin, vocab_end);
  if (dposition_embedding == nullptr) return;
  if (positions != nullptr) {
    EmbeddingGradKernel<<<Blocks(c), kElementwiseThreads, 0, stream>>>(dposition_embedding, dout,
                                                                       positions, rows, c, 0, t);
    return;
  }
  PositionEmbeddingGradKernel<<<Blocks(static_cast<size_t>(t) * c), kElementwiseThreads, 0,
                                stream>>>(dposition_embedding, dout, b, t, c);
}

#define DTRAIN_INSTANTIATE(T)                                                                   \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int, \
                                    int, const int32_t*, cudaStream_t);                         \
  template void EmbeddingBackward<T>(T*, T*, const T*, const int32_t*, int, int, int, int, int, \
                                     const int32_t*, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
