#include "parallel/sharding.h"

#include <algorithm>
#include <functional>
#include <numeric>

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

StepBuffers EstimateStepBuffers(const ParamTable& table, const ShardingStrategy& strategy,
                                int dp_size, bool pipelined) {
  const bool sharded_params = strategy.sharding == Sharding::kParameters;
  const bool sharded_grads = sharded_params || strategy.sharding == Sharding::kGradients;
  const int ranks = strategy.sharding == Sharding::kNone ? 1 : dp_size;
  const UnitLayout layout(table, strategy.unit_bytes, ranks);
  std::vector<double> units;  // values of each unit gathered or reduced whole, largest first
  for (const Unit& unit : layout.units()) units.push_back(static_cast<double>(unit.shard) * ranks);
  std::sort(units.begin(), units.end(), std::greater<>());
  // A pipelined stage accumulates its gradient units, keeps its gathered ones and lands ddp's and
  // zero1's reductions at the step's end; otherwise these go as the step goes.
  const size_t held = pipelined ? units.size() : std::min<size_t>(kUnitsInFlight, units.size());
  const double held_values = std::accumulate(units.begin(), units.begin() + held, 0.0);
  const double held_shards = held_values / ranks;
  const bool bf16_wire = strategy.reduce_type == DataType::kBF16 && dp_size > 1;
  const double compute = static_cast<double>(DataTypeBytes(strategy.param_type));
  StepBuffers buffers;
  if (sharded_params) {
    buffers.gathered_bytes = held_values * compute;
    buffers.wire_bytes += held_shards * compute;
  }
  if (sharded_grads) {
    buffers.gradient_bytes = (held_values + held_shards) * sizeof(float);
    if (bf16_wire) buffers.wire_bytes += (held_values + held_shards) * 2;
  } else if (strategy.sharding == Sharding::kOptimizer && dp_size > 1) {
    buffers.wire_bytes = bf16_wire ? (held_values + held_shards) * 2 : held_shards * sizeof(float);
  } else if (bf16_wire) {
    buffers.wire_bytes = held_values * 2;  // an all-reduce of bf16 copies; fp32 sums in place
  }
  return buffers;
}

}  // namespace dtrain
