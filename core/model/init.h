// GPT-2 style initialisation of any range of the flat parameter buffer: normal(0, init_std),
// residual projections scaled by 1/sqrt(2 n_layer), norm weights 1, biases 0. Every value is a
// pure function of (seed, tensor name, index in the tensor), so a rank that holds only a shard
// initialises it exactly as the whole model would.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/model/model_config.h"
#include "core/model/param_table.h"

namespace dtrain {

// Writes table positions [begin, end) to out[0, end - begin).
void InitParameters(const ModelConfig& config, const ParamTable& table, uint64_t seed, size_t begin,
                    size_t end, float* out);

}  // namespace dtrain
