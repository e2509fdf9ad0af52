// Where a tensor-parallel block communicates (Megatron-LM's conjugate operators f and g). The
// block's column-parallel layers (qkv, mlp.up) each start with f: identity forward, all-reduce
// of the input gradient in backward. Its row-parallel layers (attn.out, mlp.down) each end with
// g: all-reduce of the partial outputs in forward (the bias added once, after it), identity
// backward. The vocabulary-parallel embedding is a row-parallel layer (its partial lookups summed
// by g), the vocabulary-parallel head a column-parallel one (its input gradient summed by f); the
// head's softmax also combines per-row statistics over the ranks' vocabulary slots (VocabMax,
// VocabSum) and sampling gathers the slots' logits (GatherVocab). The model calls these hooks at
// those points; an implementation over a communicator lives in parallel/, so the CPU and a GPU
// backend share the model code.
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
  // The vocabulary-parallel softmax's per-row statistics, all-reduces whatever else the layout
  // splits: x (n) becomes the maximum (VocabMax) or the sum (VocabSum) over the ranks' values.
  virtual void VocabMax(float* x, size_t n) = 0;
  virtual void VocabSum(float* x, size_t n) = 0;
  // local (n) of every rank -> all (tp * n), rank r's at all[r * n]: the logits of each rank's
  // vocabulary slot, for sampling.
  virtual void GatherVocab(const float* local, float* all, size_t n) = 0;
};

// tp = 1: nothing to communicate.
class NoTensorParallel final : public TensorParallelOps {
 public:
  void ReduceForward(float*, size_t) override {}
  void ReduceBackward(float*, size_t) override {}
  void ReduceKvReplicas(float*, size_t) override {}
  void VocabMax(float*, size_t) override {}
  void VocabSum(float*, size_t) override {}
  void GatherVocab(const float* local, float* all, size_t n) override {
    std::copy(local, local + n, all);
  }
};

}  // namespace dtrain
