#include "core/model/flat_parameters.h"

namespace dtrain {

FlatParameters::FlatParameters(const ParamTable& table, Backend& backend)
    : backend_(backend),
      params_(backend.Allocate(table.total_numel())),
      grads_(backend.Allocate(table.total_numel())) {
  for (int region = -1; region <= table.last_region(); ++region) {
    region_begin_.push_back(table.BlockRange(region).first);
  }
}

}  // namespace dtrain
