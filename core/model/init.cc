#include "core/model/init.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/util/fnv.h"
#include "core/util/rng.h"

namespace dtrain {
void InitParameters(const ModelConfig& config, const ParamTable& table, uint64_t seed, size_t begin,
                    size_t end, float* out) {
  const float residual_std = config.init_std / std::sqrt(2.0f * config.n_layer);
  for (const TensorEntry& entry : table.entries()) {
    const size_t lo = std::max(begin, entry.offset);
    const size_t hi = std::min(end, entry.offset + entry.numel);
    if (lo >= hi) continue;
    float* p = out + (lo - begin);
    if (entry.is_bias || entry.is_norm_weight) {
      std::fill(p, p + (hi - lo), entry.is_bias ? 0.0f : 1.0f);
      continue;
    }
    const float std = entry.residual_projection ? residual_std : config.init_std;
    // The tensor name picks its stream and the element's index in the whole model's tensor its
    // place in it: stable across builds, ranks and shardings, tensor-parallel ones included.
    CounterRng rng(seed, Fnv1a(entry.name));
    ForEachGlobalRun(entry, lo - entry.offset, hi - entry.offset,
                     [&](size_t, size_t global, size_t count) {
                       rng.set_counter(2 * global);  // normal() takes two draws per value
                       for (size_t i = 0; i < count; ++i) {
                         *p++ = std * static_cast<float>(rng.normal());
                       }
                     });
  }
}

}  // namespace dtrain
