// Where a tensor-parallel block communicates (Megatron-LM's conjugate operators f and g). The
// block's column-parallel layers (qkv, mlp.up) each start with f: identity forward, all-reduce
// of the input gradient in backward. Its row-parallel layers (attn.out, mlp.down) each end with
// g: all-reduce of the partial outputs in forward (the bias added once, after it), identity
// backward. The model calls these hooks at those points; an implementation over a
// communicator lives in parallel/, so the CPU and a GPU backend share the model code.
//
// Every rank of the tensor-parallel group makes the same calls in the same order with the same
// counts. A failed collective is kept by the implementation and reported after the step (the
// model has no Status path): the buffers then hold unspecified values.
#pragma once

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
};

// tp = 1: nothing to communicate.
class NoTensorParallel final : public TensorParallelOps {
 public:
  void ReduceForward(float*, size_t) override {}
  void ReduceBackward(float*, size_t) override {}
  void ReduceKvReplicas(float*, size_t) override {}
};

}  // namespace dtrain
