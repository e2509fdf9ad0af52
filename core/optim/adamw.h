// AdamW over a flat parameter buffer, with per-tensor weight decay chosen by name patterns.
// Moments mirror the parameter layout; a step may update any [begin, end) range of it, which is
// how a sharded optimizer (ZeRO) updates only its own slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/backend/backend.h"
#include "core/model/param_table.h"
#include "core/recipe/recipe.h"

namespace dtrain {

// An error naming a train.no_decay glob (not one of the defaults, which hold for either family)
// that matches no tensor of `config`'s whole model by any of its names: it would exempt nothing.
absl::Status CheckNoDecay(const ModelConfig& config, const std::vector<std::string>& no_decay);

class AdamW {
 public:
  // Tensors matching any glob in train.no_decay, by their internal or their Hugging Face name
  // (core/model/hf_names.h; GPT-2's with or without "transformer."), get no weight decay. The
  // moments cover table positions [begin, end). The moments are `backend`'s memory, zero.
  AdamW(const ParamTable& table, const TrainSection& train, Backend& backend, size_t begin,
        size_t end);

  // One step on the range [begin, end), every tensor in one backend call: params and grads point
  // at the range's first value (table position `begin`), and the gradient is grads * grad_scale.
  // param_copy, when not null, gets the updated parameters in bf16 (the compute copy). Increments
  // the step count used for bias correction.
  void Step(Backend& backend, float* params, Values param_copy, const float* grads, float lr,
            float grad_scale);

  int64_t step() const { return step_; }
  // Restores the step count from a checkpoint (the moments are restored through m() and v()).
  void set_step(int64_t step) { step_ = step; }
  size_t numel() const { return end_ - begin_; }
  float* m() const { return m_.floats(); }
  float* v() const { return v_.floats(); }
  // How many values of [begin, end) get weight decay (what the tests check train.no_decay by).
  size_t decayed_numel() const;

 private:
  std::vector<AdamWRange> ranges_;  // the tensors' pieces inside [begin_, end_), from begin_
  size_t begin_, end_;
  float beta1_, beta2_, eps_, weight_decay_;
  int64_t step_ = 0;
  DeviceBuffer m_, v_;
  DeviceBuffer ranges_on_backend_;  // ranges_, which the backend's AdamW reads
};

}  // namespace dtrain
