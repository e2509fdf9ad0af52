// What the row kernels share: a row is one warp's, lane l takes the row's elements l, l + 32,
// ... (the norms: its 16-byte packs l, l + 32, ..., RowPacks in pack_math.h), and the lanes combine
// their partial results with a butterfly (each lane, for offset 16, 8, 4, 2, 1: v = combine(v, the
// value of lane ^ offset)), after which every lane holds the same result. Attention gives a row
// fewer lanes (a group of 2^k, offsets 2^(k-1), ..., 1). A row function takes the warp (or group)
// as a template parameter `Warp` with
//   int lane() const;                             // in [0, lanes)
//   V Butterfly(V v, Combine combine) const;      // V trivially copyable, 4-byte multiple
// DeviceLanes (warp.cuh) is the GPU's, with __shfl_xor_sync; tests/core/backend/cuda/test_util.h
// emulates one on host threads, so the host runs the row functions in the device's order. The
// classifier's rows, whole vocabularies, are a block's each (BlockButterfly).
#pragma once

#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

struct AddFloats {
  DTRAIN_HD float operator()(float a, float b) const { return a + b; }
};

// The sum over the warp of each lane's `partial`.
template <typename Warp>
DTRAIN_HD float WarpSum(const Warp& warp, float partial) {
  return warp.Butterfly(partial, AddFloats{});
}

// A row that is a whole block's (kThreads threads, whole warps; a Block as warp.cuh's DeviceBlock):
// each warp combines its lanes' values with a butterfly, its lane 0 posts the result in
// shared[warp] (kThreads / kWarpSize values), and every thread combines the posted values in
// warp order, so that all hold the same result, in an order that does not depend on timing.
// `shared` may be used again once the call returns.
template <int kThreads, typename Block, typename V, typename Combine>
DTRAIN_HD V BlockButterfly(const Block& block, V* shared, V v, Combine combine) {
  static_assert(kThreads % kWarpSize == 0);
  v = block.warp().Butterfly(v, combine);
  if (block.thread() % kWarpSize == 0) shared[block.warp_index()] = v;
  block.Sync();
  V total = shared[0];
  for (int w = 1; w < kThreads / kWarpSize; ++w) total = combine(total, shared[w]);
  block.Sync();
  return total;
}

}  // namespace dtrain::cuda
