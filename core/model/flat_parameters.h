// The whole model's parameters and gradients in two flat buffers, as the ParamTable lays them
// out: what one process without data parallelism (and the tests) hand to the model. Gradients
// accumulate across micro-batches until ZeroGradients.
#pragma once

#include <span>
#include <vector>

#include "core/model/block_parameters.h"
#include "core/model/param_table.h"

namespace dtrain {

class FlatParameters : public BlockParameters {
 public:
  explicit FlatParameters(const ParamTable& table);

  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }
  std::span<float> grads() { return grads_; }
  std::span<const float> grads() const { return grads_; }
  void ZeroGradients();

  const float* Acquire(int region, Pass) override { return params_.data() + begin(region); }
  void Release(int, Pass) override {}
  float* Gradients(int region) override { return grads_.data() + begin(region); }
  void GradientsReady(int) override {}

 private:
  size_t begin(int region) const { return region_begin_[region + 1]; }

  std::vector<size_t> region_begin_;  // indexed by region + 1
  std::vector<float> params_;
  std::vector<float> grads_;
};

}  // namespace dtrain
