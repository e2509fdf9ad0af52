#include "parallel/planner/auto_layout.h"

#include <string>

#include "absl/status/statusor.h"
#include "core/recipe/recipe.h"
#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/configs.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// What a trainer with DDP and ZeRO engines but no tensor or pipeline parallelism can run.
SearchOptions DataParallelOnly() {
  SearchOptions options;
  options.strategies = {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3};
  options.max_tp = 1;
  options.max_pp = 1;
  options.recompute = {Recompute::kNone, Recompute::kFull};
  options.allow_offload = false;
  options.allow_sequence_parallel = false;
  return options;
}

TEST(AutoLayoutTest, PicksARunnableLayoutAndReportsTheBetterOne) {
  const Recipe recipe = testing::ShippedRecipe("llama-70b", {"parallel.strategy=auto"});
  absl::StatusOr<AutoLayout> resolved = ResolveAutoLayout(recipe, 64, DataParallelOnly());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->layout.tp, 1);
  EXPECT_EQ(resolved->layout.pp, 1);
  EXPECT_EQ(resolved->layout.dp, 64);
  EXPECT_THAT(resolved->note, HasSubstr("which the trainer cannot run yet; using zero3 tp1"));

  Recipe applied = recipe;
  ASSERT_TRUE(ApplyLayout(resolved->layout, applied).ok());
  EXPECT_EQ(applied.parallel.strategy, "zero3");
  EXPECT_EQ(applied.parallel.recompute, "full");
  EXPECT_EQ(applied.train.micro_batch, resolved->layout.micro_batch);
}

// A better layout is noted only when the trainer cannot run it: the tiny recipe on 2 CPU ranks,
// whose unrestricted plan prefers fsdp (its simplest within the margin of other candidates)
// while the trainer's picks another engine, said "fsdp, which the trainer cannot run yet".
TEST(AutoLayoutTest, NotesNoBetterLayoutThatTheTrainerRuns) {
  const Recipe recipe = testing::ShippedRecipe("tiny", {"parallel.strategy=auto"});
  absl::StatusOr<AutoLayout> resolved =
      ResolveAutoLayout(recipe, 2, TrainerLayouts(2), /*bytes_per_rank=*/8.0 * (1 << 30));
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->note, "") << DescribeLayout(resolved->layout);
}

// What the trainer runs includes tensor parallelism: a 70B model on 64 ranks, 8 per machine,
// shards its blocks over ranks of one machine with sequence parallelism, and the recipe says so;
// no offload. With one rank per machine, tp stays 1.
TEST(AutoLayoutTest, TrainerLayoutsIncludeTensorParallelismInsideAMachine) {
  const Recipe recipe =
      testing::ShippedRecipe("llama-70b", {"parallel.strategy=auto", "run.device=cuda"});
  absl::StatusOr<AutoLayout> one_per_machine = ResolveAutoLayout(recipe, 64, TrainerLayouts(1));
  ASSERT_TRUE(one_per_machine.ok()) << one_per_machine.status();
  EXPECT_EQ(one_per_machine->layout.tp, 1);
  absl::StatusOr<AutoLayout> resolved = ResolveAutoLayout(recipe, 64, TrainerLayouts(8));
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const Layout& layout = resolved->layout;
  EXPECT_GT(layout.tp, 1) << DescribeLayout(layout);
  EXPECT_LE(layout.tp, 8) << DescribeLayout(layout);
  // Sequence parallelism with it: the same bytes, less activation memory.
  EXPECT_TRUE(layout.sequence_parallel);
  EXPECT_FALSE(layout.offload);

  Recipe applied = recipe;
  ASSERT_TRUE(ApplyLayout(layout, applied).ok());
  EXPECT_EQ(applied.parallel.tp, layout.tp);
  EXPECT_EQ(applied.parallel.pp, layout.pp);
  EXPECT_TRUE(applied.parallel.sequence_parallel);
}

// The trainer runs pipelines: gpt2-1.5b's 8 sequences on 64 ranks, 8 per machine, at most 8
// replicas, pipeline the rest in the recipe's schedule (1F1B by default, or GPipe), and the
// applied recipe says so.
TEST(AutoLayoutTest, TrainerLayoutsIncludePipelines) {
  const Recipe recipe = testing::ShippedRecipe("gpt2-1.5b", {"parallel.strategy=auto"});
  absl::StatusOr<AutoLayout> resolved = ResolveAutoLayout(recipe, 64, TrainerLayouts(8));
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const Layout& layout = resolved->layout;
  EXPECT_GT(layout.pp, 1) << DescribeLayout(layout);
  EXPECT_EQ(layout.schedule, PipelineSchedule::kOneFOneB);
  Recipe applied = recipe;
  applied.parallel.pp_virtual_stages = 3;  // stale; a pipeline of one chunk per stage resets it
  ASSERT_TRUE(ApplyLayout(layout, applied).ok());
  EXPECT_EQ(applied.parallel.pp, layout.pp);
  EXPECT_EQ(applied.parallel.pp_schedule, "1f1b");
  EXPECT_EQ(applied.parallel.pp_virtual_stages, 1);

  const Recipe gpipe =
      testing::ShippedRecipe("gpt2-1.5b", {"parallel.strategy=auto", "parallel.pp_schedule=gpipe"});
  absl::StatusOr<AutoLayout> kept = ResolveAutoLayout(gpipe, 64, TrainerLayouts(8));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_GT(kept->layout.pp, 1) << DescribeLayout(kept->layout);
  EXPECT_EQ(kept->layout.schedule, PipelineSchedule::kGpipe);
}

TEST(AutoLayoutTest, NoNoteWhenTheBestLayoutIsRunnable) {
  const Recipe recipe = testing::ShippedRecipe("gpt2-124m", {"train.batch_size=64"});
  absl::StatusOr<AutoLayout> resolved = ResolveAutoLayout(recipe, 2, SearchOptions{});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->note, "");
  EXPECT_EQ(resolved->layout.world_size(), 2);
}

// The layout a rank that does not fit is told to use is planned in what the trainer holds: at
// bf16 parameters, DDP keeps their float32 masters beside the moments (12 bytes a parameter),
// while ZeRO-3's shard is the masters (8 bytes of moments over the ranks).
TEST(AutoLayoutTest, PlanForMemoryCountsWhatTheTrainerHolds) {
  for (const bool bf16 : {false, true}) {
    const Recipe recipe =
        testing::ShippedRecipe("tiny", {bf16 ? "run.precision=bf16" : "run.precision=fp32"});
    const absl::StatusOr<Plan> plan = PlanForMemory(recipe, 1, 2, kGiB, TrainerLayouts(2));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const double params = static_cast<double>(plan->workload.model.num_parameters());
    int seen = 0;
    for (const Candidate& candidate : plan->candidates) {
      const Layout& layout = candidate.layout;
      if (candidate.verdict == Verdict::kInvalid || layout.dp != 2) continue;
      const double optimizer = candidate.estimate.memory.optimizer_bytes;
      if (layout.strategy == Strategy::kDdp) {
        EXPECT_DOUBLE_EQ(optimizer, (bf16 ? 12 : 8) * params) << bf16;
        ++seen;
      } else if (layout.strategy == Strategy::kZero3) {
        EXPECT_DOUBLE_EQ(optimizer, 8 * params / 2) << bf16;
        ++seen;
      }
    }
    EXPECT_GE(seen, 2) << bf16;
  }
}

TEST(AutoLayoutTest, ErrorsNameTheProblem) {
  const Recipe recipe = testing::ShippedRecipe("llama-70b");
  absl::StatusOr<AutoLayout> odd = ResolveAutoLayout(recipe, 12, DataParallelOnly());
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(std::string(odd.status().message()),
              HasSubstr("world of 12 ranks is not a whole number of nodes"));
  absl::StatusOr<AutoLayout> small = ResolveAutoLayout(recipe, 2, DataParallelOnly());
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(std::string(small.status().message()),
              HasSubstr("no layout the trainer runs fits 2 ranks; the closest: zero3 tp1"));
  // The recipe against the world: a restart fails alike, so the launch must not retry it.
  EXPECT_EQ(ExitCodeOf(small.status()), kExitUsage);
  Recipe batch_of_8 = testing::ShippedRecipe("gpt2-124m");
  batch_of_8.train.batch_size = 8;
  absl::StatusOr<AutoLayout> seven = ResolveAutoLayout(batch_of_8, 7, DataParallelOnly());
  ASSERT_FALSE(seven.ok());
  EXPECT_THAT(std::string(seven.status().message()),
              HasSubstr("none divides train.batch_size (8) among its data-parallel ranks"));
  EXPECT_THAT(std::string(seven.status().message()),
              HasSubstr("a train.batch_size that is a multiple of 7"));
  EXPECT_EQ(ExitCodeOf(seven.status()), kExitUsage);
}

TEST(AutoLayoutTest, ApplyLayoutRefusesWhatTheRecipeCannotSay) {
  Recipe recipe = testing::ShippedRecipe("gpt2-124m");
  ASSERT_TRUE(
      ApplyLayout({.strategy = Strategy::kZero2, .recompute = Recompute::kSelective}, recipe).ok());
  EXPECT_EQ(recipe.parallel.recompute, "selective");
  EXPECT_FALSE(ApplyLayout({.strategy = Strategy::kZero2, .offload = true}, recipe).ok());
}

}  // namespace
}  // namespace dtrain
