// The whole model's parameters and gradients in two flat buffers of the backend's memory, as the
// ParamTable lays them out: what the tests hand to the model (the trainer's engines hold their
// own, sharded). Gradients accumulate across micro-batches until ZeroGradients.
#pragma once

#include <span>
#include <vector>

#include "core/backend/backend.h"
#include "core/model/block_parameters.h"
#include "core/model/param_table.h"

namespace dtrain::testing {

class FlatParameters : public BlockParameters {
 public:
  FlatParameters(const ParamTable& table, Backend& backend)
      : backend_(backend),
        params_(backend.Allocate(table.total_numel())),
        grads_(backend.Allocate(table.total_numel())) {
    for (int region = -1; region <= table.last_region(); ++region) {
      region_begin_.push_back(table.BlockRange(region).first);
    }
  }

  // The buffers as host spans: for a backend whose memory is the host's (the CPU backend).
  std::span<float> params() { return {params_.floats(), params_.size()}; }
  std::span<const float> params() const { return {params_.floats(), params_.size()}; }
  std::span<float> grads() { return {grads_.floats(), grads_.size()}; }
  std::span<const float> grads() const { return {grads_.floats(), grads_.size()}; }
  void ZeroGradients() { backend_.Zero(grads_.floats(), grads_.size()); }

  ConstValues Acquire(int region, Pass) override { return params_.floats() + begin(region); }
  void Release(int, Pass) override {}
  float* Gradients(int region) override { return grads_.floats() + begin(region); }
  void GradientsReady(int) override {}

 private:
  size_t begin(int region) const { return region_begin_[region + 1]; }

  Backend& backend_;
  std::vector<size_t> region_begin_;  // indexed by region + 1
  DeviceBuffer params_;
  DeviceBuffer grads_;
};

}  // namespace dtrain::testing
