// Where a tensor-parallel block communicates (Megatron-LM's conjugate operators f and g). The
// block's column-parallel layers (qkv, mlp.up) each start with f: identity forward, all-reduce
// of the input gradient in backward. Its row-parallel layers (attn.out, mlp.down) each end with
// g: all-reduce of the partial outputs in forward (the bias added once, after it), identity
// backward. The vocabulary-parallel embedding is a row-parallel layer (its partial lookups summed
// by g), the vocabulary-parallel head a column-parallel one (its input gradient summed by f); the
// head's softmax also combines per-row statistics over the ranks' vocabulary slots (VocabMax,
// VocabSum) and sampling gathers the slots' logits (GatherRows). The model calls these hooks at
// those points; an implementation over a communicator lives in parallel/, so the CPU and a GPU
// backend share the model code.
//
// Under sequence parallelism the norms and residual adds between those layers run on a chunk of
// the micro-batch's token rows on each rank: f becomes an all-gather of the chunks forward (a
// reduce-scatter backward) and g a reduce-scatter forward (an all-gather backward), the same
// bytes as the all-reduces they replace.
//
// Every rank of the tensor-parallel group makes the same calls in the same order with the same
// counts. A failed collective is kept by the implementation and reported after the step (the
// model has no Status path): the buffers then hold unspecified values.
#pragma once

#include <algorithm>
#include <cstddef>

namespace dtrain {

class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;

  // g forward: x (n) becomes the sum of every rank's x.
  virtual void ReduceForward(float* x, size_t n) = 0;
  // f backward: dx (n) becomes the sum of every rank's dx.
  virtual void ReduceBackward(float* dx, size_t n) = 0;
  // Grouped-query attention with fewer kv heads than ranks replicates each kv head on
  // tp / n_kv_head ranks, and each computes only its query heads' share of that head's
  // gradient: dx (n) becomes the sum over the ranks holding the same kv head. Called by every
  // rank of the group, and only when kv heads are replicated.
  virtual void ReduceKvReplicas(float* dx, size_t n) = 0;

  // Sequence parallelism: rank r of the group holds chunk r of `count` elements.
  // gathered (size * count) receives every rank's chunk; this rank's comes from `own` (count),
  // which may be gathered's own chunk itself.
  virtual void GatherRows(const float* own, float* gathered, size_t count) = 0;
  // own (count) = this rank's chunk of the sum over ranks of `partial` (size * count); own must
  // not overlap partial.
  virtual void ScatterRows(const float* partial, float* own, size_t count) = 0;
  // A parameter every rank holds whole but applied to its own rows only (a norm under sequence
  // parallelism): its gradient grad (n) becomes the sum over the group.
  virtual void SumRowGradients(float* grad, size_t n) = 0;
  // The vocabulary-parallel softmax's per-row statistics, all-reduces whatever else the layout
  // splits: x (n) becomes the maximum (VocabMax) or the sum (VocabSum) over the ranks' values.
  virtual void VocabMax(float* x, size_t n) = 0;
  virtual void VocabSum(float* x, size_t n) = 0;
};

// tp = 1: nothing to communicate.
class NoTensorParallel final : public TensorParallelOps {
 public:
  void ReduceForward(float*, size_t) override {}
  void ReduceBackward(float*, size_t) override {}
  void ReduceKvReplicas(float*, size_t) override {}
  void GatherRows(const float* own, float* gathered, size_t count) override {
    if (own != gathered) std::copy_n(own, count, gathered);
  }
  void ScatterRows(const float* partial, float* own, size_t count) override {
    std::copy_n(partial, count, own);
  }
  void SumRowGradients(float*, size_t) override {}
  void VocabMax(float*, size_t) override {}
  void VocabSum(float*, size_t) override {}
};

}  // namespace dtrain
