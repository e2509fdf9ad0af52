// Causal attention. bf16 with head_dim 64 or 128 on sm_80 and later runs on tensor cores
// (flash_attention_math.h); everything else runs the CUDA-core kernels below.
//
// The CUDA-core kernels, tiled (arithmetic in attention_math.h): a block of kThreads threads is
// kRows = kThreads / kLanes rows of kLanes lanes each. Forward and dq: a block's rows are kRows
// consecutive query rows of one (batch, head); the keys and values they attend to pass through
// shared memory kRows at a time. dk and dv: a block's rows are kRows consecutive key rows of one
// (batch, kv head); the query and dout rows of every head of the group that see them pass through
// shared memory kRows at a time, with their lse and delta. With documents packed into the rows
// (positions_math.h) a row sees only its own document's rows, and a block streams only the rows
// its rows' documents span.
#include <algorithm>
#include <type_traits>

#include "core/backend/cuda/attention_math.h"
#include "core/backend/cuda/flash_attention_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/positions_math.h"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

constexpr int kThreads = 256;

template <int kLanes>
constexpr int kRows = kThreads / kLanes;

// rows [first, first + count) of a head's (T, d) block (row r at base + r * stride) into tile
// (count, d) in fp32.
template <typename T>
__device__ void LoadTile(float* tile, const T* base, size_t stride, int first, int count, int d) {
  for (int i = static_cast<int>(threadIdx.x); i < count * d; i += kThreads) {
    const int r = i / d;
    tile[i] = ToFloat(base[(first + r) * stride + (i - r * d)]);
  }
}

// The batch element's T positions, or null without documents.
__device__ const int32_t* RowPositions(const int32_t* positions, int b, const AttentionDims& dims) {
  return positions == nullptr ? nullptr : positions + static_cast<size_t>(b) * dims.time;
}

// A block of the forward and dq kernels (grid (B * H, query tiles)): kRows consecutive query rows
// of one (batch, head); t is the calling thread's row.
template <int kLanes>
struct QueryBlock {
  int b, h, kv, t;
  int first;                 // the block's first query row
  int end;                   // one past its last
  const int32_t* positions;  // the batch element's, or null
  __device__ QueryBlock(const AttentionDims& dims, const int32_t* all_positions)
      : b(static_cast<int>(blockIdx.x) / dims.heads),
        h(static_cast<int>(blockIdx.x) % dims.heads),
        kv(h / (dims.heads / dims.kv_heads)),
        t(static_cast<int>(blockIdx.y) * kRows<kLanes> + static_cast<int>(threadIdx.x) / kLanes),
        first(static_cast<int>(blockIdx.y) * kRows<kLanes>),
        end(min(first + kRows<kLanes>, dims.time)),
        positions(RowPositions(all_positions, b, dims)) {}
};

// Streams the key and value rows of the block's kv head (qkv: its batch element's) that its rows
// see, from its first row's first visible key to its last row, through shared memory kRows at a
// time: visit(keys, values, count) with the `count` consecutive rows of each tile that row t
// sees, for rows t < T that see any.
template <int kLanes, typename T, typename Visit>
__device__ void StreamKeys(const T* qkv, const AttentionDims& dims, const QueryBlock<kLanes>& block,
                           const Visit& visit) {
  extern __shared__ float shared[];
  float* keys = shared;
  float* values = shared + kRows<kLanes> * dims.head_dim;
  const int d = dims.head_dim;
  const RowRange visible = VisibleKeys(block.positions, min(block.t, dims.time - 1));
  for (int tile = VisibleKeys(block.positions, block.first).begin; tile < block.end;
       tile += kRows<kLanes>) {
    const int count = min(kRows<kLanes>, block.end - tile);
    LoadTile(keys, KeyAt(qkv, dims, block.kv, 0), dims.qkv_width, tile, count, d);
    LoadTile(values, ValueAt(qkv, dims, block.kv, 0), dims.qkv_width, tile, count, d);
    __syncthreads();
    int offset = 0;
    const int seen = ClipToRun(visible, tile, count, &offset);
    if (block.t < dims.time && seen > 0) visit(keys + offset * d, values + offset * d, seen);
    __syncthreads();
  }
}

template <int kLanes, typename T>
__global__ void __launch_bounds__(kThreads)
    AttentionForwardKernel(T* out, float* lse, const T* qkv, const int32_t* positions,
                           AttentionDims dims) {
  const QueryBlock<kLanes> block(dims, positions);
  const int h = block.h, t = block.t;
  qkv += static_cast<size_t>(block.b) * dims.time * dims.qkv_width;
  const DeviceLanes<kLanes> lanes;
  AttentionForwardState row;
  if (t < dims.time) row.q = LoadSlice(lanes, QueryAt(qkv, dims, h, t), dims.head_dim);
  StreamKeys(qkv, dims, block, [&](const float* keys, const float* values, int count) {
    AttendKeys(lanes, row, keys, values, dims.head_dim, count, dims);
  });
  if (t < dims.time) {
    FinishForwardRow(lanes, row, out + static_cast<size_t>(block.b) * dims.time * dims.out_width,
                     lse + static_cast<size_t>(block.b) * dims.heads * dims.time, dims, h, t);
  }
}

template <int kLanes, typename T>
__global__ void __launch_bounds__(kThreads)
    AttentionQueryGradKernel(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                             const int32_t* positions, AttentionDims dims) {
  const QueryBlock<kLanes> block(dims, positions);
  const int h = block.h, t = block.t;
  const size_t qkv_offset = static_cast<size_t>(block.b) * dims.time * dims.qkv_width;
  const size_t out_offset = static_cast<size_t>(block.b) * dims.time * dims.out_width;
  qkv += qkv_offset;
  const DeviceLanes<kLanes> lanes;
  AttentionQueryGradState row;
  if (t < dims.time) {
    row.q = LoadSlice(lanes, QueryAt(qkv, dims, h, t), dims.head_dim);
    row.dy = LoadSlice(lanes, OutAt(dout + out_offset, dims, h, t), dims.head_dim);
    row.delta = LanesDot(lanes, row.dy, OutAt(out + out_offset, dims, h, t), dims.head_dim);
    row.lse = lse[(static_cast<size_t>(block.b) * dims.heads + h) * dims.time + t];
  }
  StreamKeys(qkv, dims, block, [&](const float* keys, const float* values, int count) {
    QueryGradOverKeys(lanes, row, keys, values, dims.head_dim, count, dims);
  });
  if (t < dims.time) {
    StoreSlice(lanes, QueryAt(dqkv + qkv_offset, dims, h, t), dims.head_dim, row.acc, dims.scale);
  }
}

// Grid: (B * Hkv, key tiles).
template <int kLanes, typename T>
__global__ void __launch_bounds__(kThreads)
    AttentionKeyValueGradKernel(T* dqkv, const T* dout, const T* qkv, const T* out,
                                const float* lse, const int32_t* positions, AttentionDims dims) {
  extern __shared__ float shared[];
  float* queries = shared;
  float* dys = queries + kRows<kLanes> * dims.head_dim;
  float* tile_lse = dys + kRows<kLanes> * dims.head_dim;
  float* tile_delta = tile_lse + kRows<kLanes>;
  const int b = blockIdx.x / dims.kv_heads, kv = blockIdx.x % dims.kv_heads;
  const int group = dims.heads / dims.kv_heads;
  const int first = blockIdx.y * kRows<kLanes>;
  const int r = threadIdx.x / kLanes;
  const int s = first + r;
  const int d = dims.head_dim;
  positions = RowPositions(positions, b, dims);
  // The query rows that see the block's keys end where its last key's document does.
  const int end =
      VisibleQueries(positions, dims.time, min(first + kRows<kLanes>, dims.time) - 1).end;
  const RowRange queries_of_s = VisibleQueries(positions, dims.time, min(s, dims.time - 1));
  const size_t qkv_offset = static_cast<size_t>(b) * dims.time * dims.qkv_width;
  const size_t out_offset = static_cast<size_t>(b) * dims.time * dims.out_width;
  qkv += qkv_offset;
  dout += out_offset;
  out += out_offset;
  lse += static_cast<size_t>(b) * dims.heads * dims.time;
  const DeviceLanes<kLanes> lanes;
  AttentionKeyGradState row;
  if (s < dims.time) {
    row.k = LoadSlice(lanes, KeyAt(qkv, dims, kv, s), dims.head_dim);
    row.v = LoadSlice(lanes, ValueAt(qkv, dims, kv, s), dims.head_dim);
  }
  for (int h = kv * group; h < (kv + 1) * group; ++h) {
    for (int tile = first; tile < end; tile += kRows<kLanes>) {
      const int count = min(kRows<kLanes>, end - tile);
      LoadTile(queries, QueryAt(qkv, dims, h, 0), dims.qkv_width, tile, count, dims.head_dim);
      LoadTile(dys, OutAt(dout, dims, h, 0), dims.out_width, tile, count, dims.head_dim);
      if (r < count) {  // this row's lanes compute query row tile + r's delta, as dq's kernel does
        const int t = tile + r;
        const LaneSlice dy = LoadSlice(lanes, OutAt(dout, dims, h, t), dims.head_dim);
        const float delta = LanesDot(lanes, dy, OutAt(out, dims, h, t), dims.head_dim);
        if (lanes.lane() == 0) {
          tile_delta[r] = delta;
          tile_lse[r] = lse[static_cast<size_t>(h) * dims.time + t];
        }
      }
      __syncthreads();
      int offset = 0;
      const int seen = ClipToRun(queries_of_s, tile, count, &offset);
      if (s < dims.time && seen > 0) {
        KeyGradOverQueries(lanes, row, queries + offset * d, dys + offset * d, d, tile_lse + offset,
                           tile_delta + offset, seen, dims);
      }
      __syncthreads();
    }
  }
  if (s < dims.time) {
    StoreSlice(lanes, KeyAt(dqkv + qkv_offset, dims, kv, s), dims.head_dim, row.dk, dims.scale);
    StoreSlice(lanes, ValueAt(dqkv + qkv_offset, dims, kv, s), dims.head_dim, row.dv, 1.0f);
  }
}

bool Supported(const AttentionShape& shape) {
  return shape.head_dim > 0 && shape.head_dim <= kAttentionMaxHeadDim && shape.kv_heads > 0 &&
         shape.heads % shape.kv_heads == 0;
}

unsigned Tiles(int time, int rows) { return static_cast<unsigned>((time + rows - 1) / rows); }

template <int kLanes, typename T>
void LaunchForward(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                   const int32_t* positions, cudaStream_t stream) {
  const AttentionDims dims = MakeAttentionDims(shape);
  const dim3 grid(static_cast<unsigned>(shape.batch * shape.heads),
                  Tiles(shape.time, kRows<kLanes>));
  const size_t bytes = 2 * sizeof(float) * kRows<kLanes> * shape.head_dim;
  AttentionForwardKernel<kLanes><<<grid, kThreads, bytes, stream>>>(out, lse, qkv, positions, dims);
}

template <int kLanes, typename T>
void LaunchBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                    const AttentionShape& shape, const int32_t* positions, cudaStream_t stream) {
  const AttentionDims dims = MakeAttentionDims(shape);
  const unsigned tiles = Tiles(shape.time, kRows<kLanes>);
  const size_t tile_bytes = 2 * sizeof(float) * kRows<kLanes> * shape.head_dim;
  AttentionQueryGradKernel<kLanes>
      <<<dim3(static_cast<unsigned>(shape.batch * shape.heads), tiles), kThreads, tile_bytes,
         stream>>>(dqkv, dout, qkv, out, lse, positions, dims);
  AttentionKeyValueGradKernel<kLanes>
      <<<dim3(static_cast<unsigned>(shape.batch * shape.kv_heads), tiles), kThreads,
         tile_bytes + 2 * sizeof(float) * kRows<kLanes>, stream>>>(dqkv, dout, qkv, out, lse,
                                                                   positions, dims);
}

// launch.template operator()<kLanes>() for the lanes head_dim needs.
template <typename Launch>
void WithLanes(int head_dim, const Launch& launch) {
  switch (AttentionLanes(head_dim)) {
    case 1:
      return launch.template operator()<1>();
    case 2:
      return launch.template operator()<2>();
    case 4:
      return launch.template operator()<4>();
    case 8:
      return launch.template operator()<8>();
    case 16:
      return launch.template operator()<16>();
    default:
      return launch.template operator()<32>();
  }
}

// The tensor-core kernels: one block of flash_attention_math.h each. A causal query tile streams
// more keys the later it is, so the forward and dq grids start from the last tile (the longest
// blocks first, the short ones filling in at the end); a key tile's queries shrink the later it
// is, so dk/dv's grid is in order already.
__device__ inline int LongestFirst() { return static_cast<int>(gridDim.y - 1 - blockIdx.y); }

template <int kD>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(Bf16* out, float* lse, const Bf16* qkv, const int32_t* positions,
                       AttentionDims dims) {
  extern __shared__ uint4 flash_shared[];
  FlashForwardBlock<kD>(DeviceBlock{}, reinterpret_cast<Bf16*>(flash_shared), out, lse, qkv,
                        positions, dims, blockIdx.x / dims.heads, blockIdx.x % dims.heads,
                        LongestFirst());
}

template <int kD>
__global__ void __launch_bounds__(kFlashThreads)
    FlashQueryGradKernel(Bf16* dqkv, float* deltas, const Bf16* dout, const Bf16* qkv,
                         const Bf16* out, const float* lse, const int32_t* positions,
                         AttentionDims dims) {
  extern __shared__ uint4 flash_shared[];
  FlashQueryGradBlock<kD>(DeviceBlock{}, reinterpret_cast<Bf16*>(flash_shared), dqkv, deltas, dout,
                          qkv, out, lse, positions, dims, blockIdx.x / dims.heads,
                          blockIdx.x % dims.heads, LongestFirst());
}

template <int kD>
__global__ void __launch_bounds__(kFlashThreads)
    FlashKeyValueGradKernel(Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const float* lse,
                            const float* deltas, const int32_t* positions, AttentionDims dims) {
  extern __shared__ uint4 flash_shared[];
  FlashKeyValueGradBlock<kD>(DeviceBlock{}, reinterpret_cast<Bf16*>(flash_shared), dqkv, dout, qkv,
                             lse, deltas, positions, dims, blockIdx.x / dims.kv_heads,
                             blockIdx.x % dims.kv_heads, blockIdx.y);
}

// Whether attention of `shape` in bf16 runs on tensor cores on the current device.
bool OnTensorCores(const AttentionShape& shape) {
  int device = 0, major = 0;
  return FlashHeadDim(shape.head_dim) && cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 8;
}

// `kernel` allowed `bytes` of dynamic shared memory: past the default 48 KiB, an attribute set
// before the launch (dk/dv, and the forward at head size 128); nothing to set below it.
template <typename Kernel>
cudaError_t AllowShared(Kernel* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

template <int kD>
cudaError_t LaunchFlashForward(Bf16* out, float* lse, const Bf16* qkv, const AttentionShape& shape,
                               const int32_t* positions, cudaStream_t stream) {
  constexpr size_t bytes = kFlashForwardShared<kD>;
  if (const cudaError_t error = AllowShared(FlashForwardKernel<kD>, bytes)) return error;
  const dim3 grid(static_cast<unsigned>(shape.batch * shape.heads),
                  Tiles(shape.time, kFlashBlockRows<kD>));
  FlashForwardKernel<kD>
      <<<grid, kFlashThreads, bytes, stream>>>(out, lse, qkv, positions, MakeAttentionDims(shape));
  return cudaSuccess;
}

template <int kD>
cudaError_t LaunchFlashBackward(Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* out,
                                const float* lse, float* deltas, const AttentionShape& shape,
                                const int32_t* positions, cudaStream_t stream) {
  const AttentionDims dims = MakeAttentionDims(shape);
  if (const cudaError_t error = AllowShared(FlashQueryGradKernel<kD>, kFlashQueryGradShared<kD>)) {
    return error;
  }
  if (const cudaError_t error =
          AllowShared(FlashKeyValueGradKernel<kD>, kFlashKeyValueGradShared<kD>)) {
    return error;
  }
  const dim3 query_tiles(static_cast<unsigned>(shape.batch * shape.heads),
                         Tiles(shape.time, kFlashBlockRows<kD>));
  const dim3 key_tiles(static_cast<unsigned>(shape.batch * shape.kv_heads),
                       Tiles(shape.time, kFlashBlockRows<kD>));
  // dq's kernel writes the rows' deltas, which dk/dv's reads.
  FlashQueryGradKernel<kD><<<query_tiles, kFlashThreads, kFlashQueryGradShared<kD>, stream>>>(
      dqkv, deltas, dout, qkv, out, lse, positions, dims);
  FlashKeyValueGradKernel<kD><<<key_tiles, kFlashThreads, kFlashKeyValueGradShared<kD>, stream>>>(
      dqkv, dout, qkv, lse, deltas, positions, dims);
  return cudaSuccess;
}

}  // namespace

template <typename T>
cudaError_t AttentionForward(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                             const int32_t* positions, cudaStream_t stream) {
  if (!Supported(shape)) return cudaErrorInvalidValue;
  if (shape.batch == 0 || shape.time == 0) return cudaSuccess;
  if constexpr (std::is_same_v<T, Bf16>) {
    if (OnTensorCores(shape)) {
      return shape.head_dim == 64
                 ? LaunchFlashForward<64>(out, lse, qkv, shape, positions, stream)
                 : LaunchFlashForward<128>(out, lse, qkv, shape, positions, stream);
    }
  }
  WithLanes(shape.head_dim,
            [&]<int kLanes>() { LaunchForward<kLanes>(out, lse, qkv, shape, positions, stream); });
  return cudaSuccess;
}

template <typename T>
cudaError_t AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              float* deltas, const AttentionShape& shape, const int32_t* positions,
                              cudaStream_t stream) {
  if (!Supported(shape)) return cudaErrorInvalidValue;
  if (shape.batch == 0 || shape.time == 0) return cudaSuccess;
  if constexpr (std::is_same_v<T, Bf16>) {
    if (OnTensorCores(shape)) {
      return shape.head_dim == 64 ? LaunchFlashBackward<64>(dqkv, dout, qkv, out, lse, deltas,
                                                            shape, positions, stream)
                                  : LaunchFlashBackward<128>(dqkv, dout, qkv, out, lse, deltas,
                                                             shape, positions, stream);
    }
  }
  WithLanes(shape.head_dim, [&]<int kLanes>() {
    LaunchBackward<kLanes>(dqkv, dout, qkv, out, lse, shape, positions, stream);
  });
  return cudaSuccess;
}

#define DTRAIN_INSTANTIATE(T)                                                               \
  template cudaError_t AttentionForward<T>(T*, float*, const T*, const AttentionShape&,     \
                                           const int32_t*, cudaStream_t);                   \
  template cudaError_t AttentionBackward<T>(T*, const T*, const T*, const T*, const float*, \
                                            float*, const AttentionShape&, const int32_t*,  \
                                            cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
