// Where a model's parameters and gradients live, region by region. A region is a contiguous
// range of the ParamTable's flat buffer: the embeddings (-1), one block (0..n_layer-1) or the
// final norm and output head (n_layer). The model asks for a region right before it computes
// with it and says when it is done, so that a data-parallel engine can gather sharded
// parameters just in time, prefetch the next region, free gathered copies, and reduce a
// region's gradients as soon as backward has produced them.
#pragma once

#include "core/backend/values.h"
#include "core/util/data_type.h"

namespace dtrain {

enum class Pass { kForward, kBackward };

class BlockParameters {
 public:
  virtual ~BlockParameters() = default;

  // The type of the parameters the model computes with (Acquire's), float32 or bf16; the model
  // keeps its activations in it too.
  virtual DataType compute_type() const { return DataType::kF32; }
  // The region's full parameters, laid out as in the ParamTable: the tensor at table offset o
  // is at Acquire(region) + (o - region begin). Valid until the matching Release.
  virtual ConstValues Acquire(int region, Pass pass) = 0;
  virtual void Release(int region, Pass pass) = 0;
  // Where this micro-batch's gradient of the region accumulates (same layout), float32 whatever
  // the compute type. The first call for a region in a micro-batch may hand out a zeroed buffer.
  virtual float* Gradients(int region) = 0;
  // Every contribution of this micro-batch to the region's gradient is in.
  virtual void GradientsReady(int region) = 0;
};

}  // namespace dtrain
