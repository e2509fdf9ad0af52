// How the data-parallel engines cut the flat parameter buffer: into units (consecutive regions
// reduced, gathered and sharded together) and, within each unit, one equal slice per rank.
// DDP, ZeRO-1/2/3 and FSDP differ only in what is sharded and in the unit size (sharding.cc).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/param_table.h"
#include "core/recipe/recipe.h"
#include "core/util/data_type.h"

namespace dtrain {

enum class Sharding {
  kNone,        // ddp: everything replicated; gradients all-reduced
  kOptimizer,   // zero1: optimizer state sharded; gradients all-reduced, parameters gathered
  kGradients,   // zero2: + gradients reduce-scattered into shards
  kParameters,  // zero3, fsdp: + parameters sharded and gathered just in time
};

struct ShardingStrategy {
  std::string name;
  Sharding sharding = Sharding::kNone;
  size_t unit_bytes = 0;  // regions merge into units up to this size; 0 = one region per unit
  // The type of the parameters the model computes with (run.precision): kF32, the masters
  // themselves, or kBF16, the float32 masters rounded after each update (to nearest even) and
  // gathered at that width; the values are held in float32 either way.
  DataType param_type = DataType::kF32;
  // The type the float32 gradients travel in over the data-parallel ranks (parallel.reduce_dtype):
  // kF32, or kBF16 (rounded before each reduction, widened after).
  DataType reduce_type = DataType::kF32;
};

// `bf16_params`: Recipe::bf16_params(), which also makes reduce_dtype auto bf16 (PyTorch FSDP's
// rule: gradients reduce in param_dtype unless reduce_dtype says otherwise).
absl::StatusOr<ShardingStrategy> ShardingStrategyFromRecipe(const ParallelSection& parallel,
                                                            bool bf16_params = false);

// Units cover the regions in order; the embeddings (-1) and the final region (n_layer) are
// always units of their own (the tied head keeps them gathered longer than any block).
struct Unit {
  int first_region = 0;
  int last_region = 0;
  size_t begin = 0;  // table positions [begin, end)
  size_t end = 0;
  size_t shard = 0;         // values per rank: ceil((end - begin) / ranks)
  size_t padded_begin = 0;  // where the unit starts in a padded buffer of ranks * shard each
  size_t shard_begin = 0;   // where this unit's slice starts in a rank's shard buffer
};

class UnitLayout {
 public:
  // `ranks` slices per unit (1: no padding, table layout).
  UnitLayout(const ParamTable& table, size_t unit_bytes, int ranks);

  const std::vector<Unit>& units() const { return units_; }
  const Unit& unit_of(int region) const { return units_[unit_of_[region + 1]]; }
  int unit_index(int region) const { return unit_of_[region + 1]; }
  int ranks() const { return ranks_; }
  size_t padded_size() const { return padded_size_; }  // all units, ranks * shard each
  size_t shard_size() const { return shard_size_; }    // one rank's slices, all units
  size_t max_padded_unit() const { return max_padded_unit_; }
  // Position of table position `position` (inside `unit`) in the padded buffer.
  size_t padded(const Unit& unit, size_t position) const {
    return unit.padded_begin + (position - unit.begin);
  }
  // Table range [begin, end) of rank `rank`'s slice of `unit` (may be empty at the end).
  std::pair<size_t, size_t> slice(const Unit& unit, int rank) const;

 private:
  std::vector<Unit> units_;
  std::vector<int> unit_of_;  // indexed by region + 1
  int ranks_;
  size_t padded_size_ = 0;
  size_t shard_size_ = 0;
  size_t max_padded_unit_ = 0;
};

// Units the engine holds at once in a step, gathered, as gradients (under sharding) and as
// reductions' copies (ddp and zero1): one in use (computed with, or filled by backward), the next
// (prefetched, or on the wire), and the tied embedding's (read again by the head; its gradient
// filled from the classifier to the end of backward). A pipelined step holds a stage's all
// until its end.
inline constexpr size_t kUnitsInFlight = 3;

// At most what DataParallelEngine holds for a moment in a step besides the model state, for
// `table` over `dp_size` ranks: kUnitsInFlight units at once, or a pipelined stage's
// (`pipelined`) all until its last backward.
struct StepBuffers {
  double gathered_bytes = 0;  // zero3, fsdp: parameter units gathered in the compute type
  double gradient_bytes = 0;  // zero2, zero3, fsdp: gradient units and their reduced shards
  // Gather inputs, the reductions' bf16 copies (parallel.reduce_dtype), and ZeRO-1's reduced
  // shards.
  double wire_bytes = 0;

  double total_bytes() const { return gathered_bytes + gradient_bytes + wire_bytes; }
};
StepBuffers EstimateStepBuffers(const ParamTable& table, const ShardingStrategy& strategy,
                                int dp_size, bool pipelined);

}  // namespace dtrain
