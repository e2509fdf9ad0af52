#include "parallel/planner/plan_report.h"

#include <algorithm>
#include <string>

#include "absl/status/statusor.h"
#include "core/recipe/recipe.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/planner/catalog.h"
#include "parallel/planner/search.h"
#include "tests/testing/configs.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Plan PlanFor(const std::string& config, const std::vector<std::string>& overrides) {
  const Recipe recipe = testing::ShippedRecipe(config, overrides);
  absl::StatusOr<ClusterSpec> cluster = ResolveCluster(recipe.cluster);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<Plan> plan = SearchLayouts(GpuWorkloadFromRecipe(recipe), *cluster);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

TEST(PlanReportTest, TextHasUnitsEnvironmentRecipeAndSbatchLines) {
  const Plan plan = PlanFor("llama-13b", {"cluster.nodes=8"});
  const std::string text = PlanText(plan, "llama-13b.yaml", 6);
  EXPECT_THAT(text, HasSubstr("Recommended: "));
  EXPECT_THAT(text, HasSubstr("GiB of 71.6 GiB usable per GPU"));
  EXPECT_THAT(text, HasSubstr("mem GiB  comm GB exposed ms   step ms  MFU %"));
  EXPECT_THAT(text, HasSubstr("ddp: "));  // why not plain DDP
  EXPECT_THAT(text, HasSubstr("export NCCL_IB_HCA=mlx5"));
  EXPECT_THAT(text, Not(HasSubstr("NCCL_IB_GID_INDEX")));
  EXPECT_THAT(text, HasSubstr("parallel:\n  strategy: "));
  EXPECT_THAT(text, HasSubstr("#SBATCH --nodes=8\n#SBATCH --ntasks-per-node=8\n"
                              "#SBATCH --gpus-per-node=8\n#SBATCH --signal=TERM@120\n"
                              "#SBATCH --requeue\nexport DTRAIN_RDZV_TOKEN=$(od"));
  EXPECT_THAT(text, HasSubstr("\nexport NCCL_IB_TIMEOUT=22\n"));
  EXPECT_THAT(text, HasSubstr("srun --kill-on-bad-exit=1 dtrain train llama-13b.yaml \\\n"
                              "  --set run.device=cuda --set parallel.strategy="));
  EXPECT_THAT(text, HasSubstr(" --set parallel.timeout_s=600 --set train.micro_batch="));
  EXPECT_THAT(text, HasSubstr(" ms.\n"));  // the footer's search time
}

// A step that mostly waits says on what, and what shrinks that part: a larger batch for
// Llama 7B's data-parallel reduction over a slow link, a faster link for GPT-2's pipeline sends,
// which no batch hides (the pipeline is already the fastest layout).
TEST(PlanReportTest, AStepThatMostlyWaitsNamesWhatItWaitsOn) {
  const std::string reduction =
      PlanText(PlanFor("llama-7b", {"cluster.intra_gbps=0.001"}), "llama-7b.yaml", 3);
  EXPECT_THAT(reduction, HasSubstr("of the time, exposed DP traffic most of the rest ("));
  EXPECT_THAT(reduction, HasSubstr("1024 sequences per step are too few for 8 GPUs to hide it; "
                                   "raise train.batch_size\n"));
  const std::string sends =
      PlanText(PlanFor("gpt2-124m", {"cluster.intra_gbps=0.001"}), "gpt2-124m.yaml", 3);
  EXPECT_THAT(sends, HasSubstr("of the time, exposed PP traffic most of the rest ("));
  EXPECT_THAT(sends, HasSubstr("it grows with the tokens, not the batch: only a faster link "
                               "between the GPUs shrinks it"));
}

// A GPU of the catalog that dtrain's backend does not run is planned, and the plan says so.
TEST(PlanReportTest, AGpuThatDtrainDoesNotRunIsPlannedToCompare) {
  EXPECT_THAT(PlanText(PlanFor("llama-7b", {"cluster.gpu=mi300x"}), "llama-7b.yaml", 3),
              HasSubstr("note     dtrain trains on NVIDIA GPUs (CUDA, NCCL): the AMD Instinct "
                        "MI300X 192GB is planned to compare, and the lines below are for CUDA\n"));
  EXPECT_THAT(PlanText(PlanFor("llama-7b", {}), "llama-7b.yaml", 3),
              Not(HasSubstr("dtrain trains on NVIDIA GPUs")));
}

TEST(PlanReportTest, RoceAndSocketsGetTheirSettings) {
  ClusterSpec cluster;
  cluster.nodes = 2;
  cluster.network_transport = Transport::kRoce;
  const auto roce = NetworkEnvironment(cluster);
  EXPECT_TRUE(std::any_of(roce.begin(), roce.end(),
                          [](const auto& e) { return e.first == "NCCL_IB_GID_INDEX=3"; }));
  cluster.network_transport = Transport::kSocket;
  const auto sockets = NetworkEnvironment(cluster);
  EXPECT_TRUE(std::any_of(sockets.begin(), sockets.end(),
                          [](const auto& e) { return e.first == "NCCL_IB_DISABLE=1"; }));
  cluster.nodes = 1;
  EXPECT_TRUE(NetworkEnvironment(cluster).empty());
  EXPECT_EQ(CollectiveTimeoutS(1000), 600);
  EXPECT_EQ(CollectiveTimeoutS(60000), 600);
  // Three steps of 405 s, in whole minutes (twenty steps' worth gave 8100 s: a hang unnoticed
  // for over two hours).
  EXPECT_EQ(CollectiveTimeoutS(405000), 1260);
}

// Llama 7B's 1024 sequences on 3 nodes of 7 GPUs: no dp of 3, 7 or 21 splits them, so the plan
// is a 21-stage pipeline; the note says why and which batch lets data parallelism in (nothing
// did).
TEST(PlanReportTest, ABatchThatKeepsDataParallelismOutIsNamed) {
  const Plan plan = PlanFor("llama-7b", {"cluster.nodes=3", "cluster.gpus_per_node=7"});
  ASSERT_NE(plan.recommendation(), nullptr);
  EXPECT_EQ(plan.recommendation()->layout.dp, 1);
  const std::string note =
      "train.batch_size 1024 does not divide over dp 3, 7, 21, so the layouts with more "
      "data-parallel ranks are out; a batch of 1008 or 1029 sequences (a multiple of 21) lets them "
      "in";
  EXPECT_THAT(PlanText(plan, "llama-7b.yaml", 4), HasSubstr("  note     " + note));
  EXPECT_EQ(PlanJson(plan, "llama-7b.yaml", 4)["batch_note"], note);
  EXPECT_EQ(BatchLimitNote(PlanFor("llama-7b", {})), "");
}

TEST(PlanReportTest, JsonCarriesTheSameContent) {
  const Plan plan = PlanFor("llama-7b", {"cluster.nodes=2", "cluster.network=roce-200"});
  const nlohmann::json json = PlanJson(plan, "llama-7b.yaml", 4);
  ASSERT_TRUE(json["recommended"].is_object());
  EXPECT_EQ(json["recommended"]["verdict"], "recommended");
  EXPECT_GT(json["recommended"]["memory_gib"]["total"].get<double>(), 0);
  EXPECT_GT(json["recommended"]["time"]["step_ms"].get<double>(), 0);
  EXPECT_LE(json["alternatives"].size(), 4u);
  EXPECT_EQ(json["network_env"]["NCCL_IB_GID_INDEX"], "3");
  EXPECT_EQ(json["cluster"]["nodes"], 2);
  EXPECT_THAT(json["sbatch_lines"].get<std::string>(), HasSubstr("--nodes=2"));
}

TEST(PlanReportTest, RecipeLinesSetEveryLayoutKey) {
  const std::string lines = RecipeLines({.strategy = Strategy::kFsdp,
                                         .tp = 4,
                                         .dp = 2,
                                         .micro_batch = 2,
                                         .recompute = Recompute::kSelective,
                                         .sequence_parallel = true},
                                        900);
  EXPECT_EQ(lines,
            "run:\n  device: cuda\n"
            "parallel:\n  strategy: fsdp\n  tp: 4\n  pp: 1\n  recompute: selective\n"
            "  sequence_parallel: true\n  timeout_s: 900\n"
            "train:\n  micro_batch: 2\n");
}

// A pipeline's lines name its schedule, which the recipe takes as parallel.pp_schedule.
TEST(PlanReportTest, PipelineRecipeLinesNameTheSchedule) {
  const Layout layout{.strategy = Strategy::kZero1,
                      .pp = 4,
                      .dp = 2,
                      .micro_batch = 1,
                      .schedule = PipelineSchedule::kOneFOneB};
  EXPECT_EQ(RecipeLines(layout, 600),
            "run:\n  device: cuda\n"
            "parallel:\n  strategy: zero1\n  tp: 1\n  pp: 4\n  pp_schedule: 1f1b\n"
            "  recompute: none\n  timeout_s: 600\n"
            "train:\n  micro_batch: 1\n");
  EXPECT_EQ(DescribeLayout(layout), "zero1 tp1 pp4 dp2 mb1 1f1b");
}

// A pipeline's stages carry the embedding first and the head last. GPT-2 small's head
// (50257 x 768) costs 3.7 to 4.9 of its blocks (by recomputation), so the last of 4 stages runs
// one block where an even split would give it 3.
TEST(PlanReportTest, PipelineLayoutsPrintTheirStageAssignment) {
  Plan plan = PlanFor("gpt2-124m", {});
  const auto pipelined = std::find_if(
      plan.candidates.begin(), plan.candidates.end(),
      [](const Candidate& c) { return c.layout.pp == 4 && c.verdict != Verdict::kInvalid; });
  ASSERT_NE(pipelined, plan.candidates.end());
  plan.recommended = static_cast<int>(pipelined - plan.candidates.begin());
  const std::string text = PlanText(plan, "gpt2-124m.yaml", 3);
  EXPECT_THAT(text, HasSubstr("  stages   stage 0: embedding + block"));
  EXPECT_THAT(text, HasSubstr("; stage 3: block 11 + head; heaviest stage "));
  EXPECT_EQ(PlanJson(plan, "gpt2-124m.yaml", 3)["pipeline_stages"],
            PipelineStagesLine(plan.workload, pipelined->layout));
  // Without a pipeline, no stages line.
  const Plan unpipelined = PlanFor("llama-13b", {"cluster.nodes=8"});
  ASSERT_EQ(unpipelined.recommendation()->layout.pp, 1);
  EXPECT_THAT(PlanText(unpipelined, "x.yaml", 3), Not(HasSubstr("  stages ")));
}

TEST(PlanReportTest, AlternativesShowEachStrategyOnce) {
  const Plan plan = PlanFor("llama-70b", {"cluster.nodes=8"});
  const auto shown = Alternatives(plan, 3);
  ASSERT_EQ(shown.size(), 3u);
  EXPECT_NE(shown[0]->layout.strategy, shown[1]->layout.strategy);
  EXPECT_NE(shown[1]->layout.strategy, shown[2]->layout.strategy);
}

}  // namespace
}  // namespace dtrain
