#include "parallel/sharding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

absl::StatusOr<ShardingStrategy> StrategyNamed(const ParallelSection& parallel) {
  const auto mib = [](double mb) { return static_cast<size_t>(mb * 1024 * 1024); };
  if (parallel.strategy == "ddp")
    return ShardingStrategy{"ddp", Sharding::kNone, mib(parallel.bucket_mb)};
  if (parallel.strategy == "zero1") {
    return ShardingStrategy{"zero1", Sharding::kOptimizer, mib(parallel.bucket_mb)};
  }
  if (parallel.strategy == "zero2") {
    return ShardingStrategy{"zero2", Sharding::kGradients, mib(parallel.bucket_mb)};
  }
  if (parallel.strategy == "zero3") {
    return ShardingStrategy{"zero3", Sharding::kParameters, mib(parallel.prefetch_bucket_mb)};
  }
  if (parallel.strategy == "fsdp") return ShardingStrategy{"fsdp", Sharding::kParameters, 0};
  return absl::InvalidArgumentError(
      absl::StrCat("parallel.strategy: ", parallel.strategy,
                   " has no data-parallel engine; use ddp, zero1, zero2, zero3 or fsdp"));
}

}  // namespace

absl::StatusOr<ShardingStrategy> ShardingStrategyFromRecipe(const ParallelSection& parallel,
                                                            bool bf16_params) {
  ASSIGN_OR_RETURN(ShardingStrategy strategy, StrategyNamed(parallel));
  if (bf16_params) strategy.param_type = DataType::kBF16;
  if (parallel.reduce_dtype == "bf16" || (parallel.reduce_dtype == "auto" && bf16_params)) {
    strategy.reduce_type = DataType::kBF16;
  }
  return strategy;
}

UnitLayout::UnitLayout(const ParamTable& table, size_t unit_bytes, int ranks) : ranks_(ranks) {
  const int last = table.last_region();
  unit_of_.assign(last + 2, -1);
  for (int region = -1; region <= last; ++region) {
    if (!table.HasRegion(region)) continue;  // a pipeline stage without this region
    // A held region may be empty (a vocabulary slot of padding only): a unit of no elements.
    const auto [begin, end] = table.BlockRange(region);
    const bool own_unit = region == -1 || region == last;
    // Only consecutive blocks merge: a stage's model chunks (interleaved schedules) finish
    // their backwards at different times, and a unit is reduced when all its regions are done.
    const bool merge = !units_.empty() && !own_unit && units_.back().last_region == region - 1 &&
                       units_.back().last_region != -1 &&
                       (units_.back().end - units_.back().begin) * sizeof(float) < unit_bytes;
    if (merge) {
      units_.back().last_region = region;
      units_.back().end = end;
    } else {
      units_.push_back(Unit{region, region, begin, end});
    }
    unit_of_[region + 1] = static_cast<int>(units_.size()) - 1;
  }
  for (Unit& unit : units_) {
    unit.shard = (unit.end - unit.begin + ranks - 1) / ranks;
    unit.padded_begin = padded_size_;
    unit.shard_begin = shard_size_;
    padded_size_ += unit.shard * ranks;
    shard_size_ += unit.shard;
    max_padded_unit_ = std::max(max_padded_unit_, unit.shard * ranks);
  }
}

std::pair<size_t, size_t> UnitLayout::slice(const Unit& unit, int rank) const {
  const size_t begin = std::min(unit.end, unit.begin + rank * unit.shard);
  return {begin, std::min(unit.end, begin + unit.shard)};
}

}  // namespace dtrain
