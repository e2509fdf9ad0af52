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
//
// Activations (and their gradients) move in the model's activation type, as Values, bf16 at bf16
// activations as Megatron-LM's are; parameter gradients and the softmax's statistics in float32.
#pragma once

#include <cstddef>
#include <cstring>

#include "core/backend/values.h"

namespace dtrain {

class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;

  // g forward: x (n) becomes the sum of every rank's x.
  virtual void ReduceForward(Values x, size_t n) = 0;
  // f backward: dx (n) becomes the sum of every rank's dx.
  virtual void ReduceBackward(Values dx, size_t n) = 0;
  // Grouped-query attention with fewer kv heads than ranks replicates each kv head on
  // tp / n_kv_head ranks, and each computes only its query heads' share of that head's
  // gradient: dx (n) becomes the sum over the ranks holding the same kv head. Called by every
  // rank of the group, and only when kv heads are replicated.
  virtual void ReduceKvReplicas(float* dx, size_t n) = 0;

  // Sequence parallelism: rank r of the group holds chunk r of `count` elements.
  // gathered (size * count) receives every rank's chunk; this rank's comes from `own` (count),
  // which may be gathered's own chunk itself.
  virtual void GatherRows(ConstValues own, Values gathered, size_t count) = 0;
  // own (count) = this rank's chunk of the sum over ranks of `partial` (size * count); own must
  // not overlap partial.
  virtual void ScatterRows(ConstValues partial, Values own, size_t count) = 0;
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
  void ReduceForward(Values, size_t) override {}
  void ReduceBackward(Values, size_t) override {}
  void ReduceKvReplicas(float*, size_t) override {}
  // One rank holds everything: the model never splits rows at tp 1, so these only copy, in host
  // memory.
  void GatherRows(ConstValues own, Values gathered, size_t count) override {
    if (own.data() != gathered.data()) Copy(gathered, own, count);
  }
  void ScatterRows(ConstValues partial, Values own, size_t count) override {
    Copy(own, partial, count);
  }
  void SumRowGradients(float*, size_t) override {}
  void VocabMax(float*, size_t) override {}
  void VocabSum(float*, size_t) override {}

 private:
  static void Copy(Values to, ConstValues from, size_t count) {
    if (count > 0) std::memcpy(to.data(), from.data(), count * DataTypeBytes(from.dtype()));
  }
};

}  // namespace dtrain
