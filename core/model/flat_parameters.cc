#include "core/model/flat_parameters.h"

#include <algorithm>

namespace dtrain {

FlatParameters::FlatParameters(const ParamTable& table)
    : params_(table.total_numel()), grads_(table.total_numel()) {
  for (int region = -1; region <= table.last_region(); ++region) {
    region_begin_.push_back(table.BlockRange(region).first);
  }
}

void FlatParameters::ZeroGradients() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

}  // namespace dtrain
