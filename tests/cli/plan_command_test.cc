// `dtrain plan` as a user runs it: its recipe lines are a recipe, and the layout it recommends
// trains.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/multi_process.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// A plan's recipe lines as "section.key=value" overrides: "section:" lines open a section,
// "  key: value" lines set a key in it, comments (what the recipe cannot say) are skipped.
std::vector<std::string> RecipeLinesAsSets(const std::string& lines) {
  std::string section;
  std::vector<std::string> sets;
  for (absl::string_view line : absl::StrSplit(lines, '\n', absl::SkipEmpty())) {
    const absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(line);
    if (absl::StartsWith(trimmed, "#")) continue;
    const std::vector<std::string> parts = absl::StrSplit(trimmed, absl::MaxSplits(": ", 1));
    if (trimmed == line) {  // a section
      EXPECT_TRUE(absl::EndsWith(line, ":")) << line;
      section = std::string(absl::StripSuffix(line, ":"));
      continue;
    }
    EXPECT_EQ(parts.size(), 2u) << line;
    if (parts.size() != 2) continue;
    sets.push_back(absl::StrCat(section, ".", parts[0], "=", parts[1]));
  }
  return sets;
}

// The "Recipe lines:" block of a plan's text as --set arguments.
std::string RecipeLinesAsOverrides(const std::string& plan_text) {
  const size_t begin = plan_text.find("\nRecipe lines:\n");
  const size_t end = plan_text.find("\nsbatch lines:\n");
  EXPECT_NE(begin, std::string::npos) << plan_text;
  EXPECT_NE(end, std::string::npos) << plan_text;
  if (begin == std::string::npos || end == std::string::npos) return "";
  const std::vector<std::string> sets =
      RecipeLinesAsSets(plan_text.substr(begin + 15, end - begin - 15));
  return sets.empty() ? "" : absl::StrCat(" --set ", absl::StrJoin(sets, " --set "));
}

// The stems of the recipes under configs/ ("llama-7b"), sorted.
std::vector<std::string> ShippedConfigs() {
  std::vector<std::string> names;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(DTRAIN_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Every shipped config's plan prints recipe lines that `dtrain recipe check` accepts when
// applied to that config.
TEST(PlanCommandTest, RecipeLinesOfEveryShippedConfigAreAValidRecipe) {
  const std::vector<std::string> configs = ShippedConfigs();
  EXPECT_GE(configs.size(), 9u);
  for (const std::string& name : configs) {
    const std::string path = absl::StrCat(DTRAIN_SOURCE_DIR, "/configs/", name, ".yaml");
    SCOPED_TRACE(path);
    const testing::Outcome plan = testing::RunDtrain(absl::StrCat("plan ", path));
    ASSERT_EQ(plan.exit_code, 0) << plan.stderr_text;
    const std::string overrides = RecipeLinesAsOverrides(plan.stdout_text);
    ASSERT_NE(overrides.find("--set parallel.strategy="), std::string::npos) << overrides;
    const testing::Outcome check =
        testing::RunDtrain(absl::StrCat("recipe check ", path, overrides));
    EXPECT_EQ(check.exit_code, 0) << overrides << "\n" << check.stderr_text;
  }
}

// The assumptions line names the recipe's pipeline schedule, the one the trainer runs.
TEST(PlanCommandTest, AssumptionsNameTheRecipesPipelineSchedule) {
  for (const char* schedule : {"1f1b", "gpipe"}) {
    SCOPED_TRACE(schedule);
    const testing::Outcome plan =
        testing::RunDtrain(absl::StrCat("plan ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set ",
                                        "parallel.pp_schedule=", schedule));
    ASSERT_EQ(plan.exit_code, 0) << plan.stderr_text;
    EXPECT_TRUE(
        absl::StrContains(plan.stdout_text, absl::StrCat(", ", schedule, " pipeline schedule, ")))
        << plan.stdout_text;
  }
  const testing::Outcome interleaved = testing::RunDtrain(
      absl::StrCat("plan ", DTRAIN_SOURCE_DIR,
                   "/configs/tiny.yaml --set parallel.pp=2 --set parallel.pp_schedule=interleaved "
                   "--set parallel.pp_virtual_stages=2"));
  ASSERT_EQ(interleaved.exit_code, 0) << interleaved.stderr_text;
  EXPECT_TRUE(absl::StrContains(interleaved.stdout_text,
                                ", interleaved (2 model chunks per stage) pipeline schedule, "))
      << interleaved.stdout_text;
}

// Nothing fitting: the text, the error and the JSON (`nothing_fits`) name the nodes that would,
// and the command exits 1.
TEST(PlanCommandTest, NothingFittingNamesTheNodesThatWouldInTextAndJson) {
  const std::string plan = absl::StrCat("plan ", DTRAIN_SOURCE_DIR,
                                        "/configs/llama-70b.yaml --set cluster.nodes=1 --set "
                                        "cluster.gpus_per_node=2 --set cluster.gpu=l40s");
  const testing::Outcome text = testing::RunDtrain(plan);
  EXPECT_EQ(text.exit_code, 1) << text.stderr_text;
  EXPECT_THAT(text.stdout_text, HasSubstr("Nothing to recommend: no layout fits"));
  EXPECT_THAT(text.stderr_text, HasSubstr("nodes, 32 (64 GPUs) are the first that fit it"));
  const testing::Outcome json = testing::RunDtrain(plan + " --json");
  EXPECT_EQ(json.exit_code, 1) << json.stderr_text;
  const nlohmann::json parsed = nlohmann::json::parse(json.stdout_text);
  EXPECT_TRUE(parsed["recommended"].is_null());
  EXPECT_THAT(parsed["nothing_fits"].get<std::string>(),
              HasSubstr("plan with cluster.nodes 32, or GPUs with more memory"));
}

// The recipe's own layout is shown beside the recommendation, however far down the ranking it
// is (llama-7b's fsdp with full recomputation at micro-batch 1), in text and JSON.
TEST(PlanCommandTest, TheRecipesOwnLayoutIsShown) {
  const std::string recipe = absl::StrCat(DTRAIN_SOURCE_DIR, "/configs/llama-7b.yaml");
  const testing::Outcome text = testing::RunDtrain(absl::StrCat("plan ", recipe, " --top 1"));
  ASSERT_EQ(text.exit_code, 0) << text.stderr_text;
  EXPECT_THAT(text.stdout_text,
              HasSubstr("The recipe's own layout (parallel.*, train.micro_batch):\n  fsdp       1 "
                        "  1     8   1 full"));
  const testing::Outcome json =
      testing::RunDtrain(absl::StrCat("plan ", recipe, " --json --top 1"));
  ASSERT_EQ(json.exit_code, 0) << json.stderr_text;
  const nlohmann::json own = nlohmann::json::parse(json.stdout_text)["recipe_layout"];
  EXPECT_EQ(own["strategy"], "fsdp");
  EXPECT_EQ(own["recompute"], "full");
  EXPECT_EQ(own["micro_batch"], 1);
  EXPECT_EQ(own["dp"], 8);
  // A layout the trainer would refuse says why (gpt2-124m's batch of 8 over 8 GPUs at mb 8).
  const testing::Outcome refused = testing::RunDtrain(
      absl::StrCat("plan ", DTRAIN_SOURCE_DIR, "/configs/gpt2-124m.yaml --top 1"));
  EXPECT_THAT(refused.stdout_text,
              HasSubstr("  ddp tp1 pp1 dp8 mb8: train.batch_size 8 is not a multiple of dp 8 x "
                        "train.micro_batch 8, which the trainer refuses\n"));
  // zero3, which the search lists as fsdp, is shown as fsdp's row of its layout, saying so (it
  // blamed the micro-batch, then pointed to fsdp rows --top 1 did not show).
  const std::string zero3 = absl::StrCat("plan ", recipe, " --top 1 --set parallel.strategy=zero3");
  EXPECT_THAT(testing::RunDtrain(zero3).stdout_text,
              HasSubstr("The recipe's own layout (parallel.*, train.micro_batch):\n  zero3 shards "
                        "as fsdp does and costs the same, so the planner lists it as fsdp:\n  "
                        "fsdp       1   1     8   1 full"));
  const nlohmann::json as_fsdp =
      nlohmann::json::parse(testing::RunDtrain(zero3 + " --json").stdout_text)["recipe_layout"];
  EXPECT_EQ(as_fsdp["strategy"], "fsdp");
  EXPECT_EQ(as_fsdp["micro_batch"], 1);
  EXPECT_THAT(as_fsdp["note"].get<std::string>(), HasSubstr("lists it as fsdp"));
  // Where fsdp's row is not searched either (a micro-batch of 3), the reason is fsdp's, not that
  // zero3 is not searched.
  EXPECT_THAT(testing::RunDtrain(zero3 + " --set train.micro_batch=3 --set train.batch_size=48")
                  .stdout_text,
              HasSubstr("  zero3 tp1 pp1 dp8 mb3 recompute=full: not among the layouts the planner "
                        "searches (micro-batches of powers of two up to 64;"));
  // A tp x pp that does not divide the cluster says so (its row was left out without a word).
  const testing::Outcome undivided =
      testing::RunDtrain(absl::StrCat("plan ", recipe,
                                      " --top 1 --set parallel.tp=2 --set parallel.pp=2 --set "
                                      "cluster.gpus_per_node=6"));
  EXPECT_THAT(undivided.stdout_text, HasSubstr("  fsdp tp2 pp2 mb1 "));
  EXPECT_THAT(undivided.stdout_text,
              HasSubstr(": parallel.tp x parallel.pp = 4 does not divide the cluster's 6 GPUs"));
  // parallel.strategy auto has none of its own.
  const testing::Outcome automatic =
      testing::RunDtrain(absl::StrCat("plan ", recipe, " --set parallel.strategy=auto"));
  EXPECT_THAT(automatic.stdout_text, ::testing::Not(HasSubstr("The recipe's own layout")));
}

// The largest cluster a recipe takes (2^20 nodes of 1,024 GPUs): dp x micro-batch overflowed an
// int, and the recipe's own layout's line divided by the 0 it wrapped to (SIGFPE). Nothing fits a
// batch of 8 there: exit 1, saying why.
TEST(PlanCommandTest, TheLargestClusterIsPlannedWithoutOverflow) {
  const testing::Outcome plan =
      testing::RunDtrain(absl::StrCat("plan ", DTRAIN_SOURCE_DIR,
                                      "/configs/gpt2-124m.yaml --set cluster.nodes=1048576 "
                                      "--set cluster.gpus_per_node=1024"));
  EXPECT_EQ(plan.exit_code, 1) << plan.stderr_text;
  EXPECT_THAT(plan.stdout_text, HasSubstr("Nothing to recommend: no layout splits the model and "
                                          "the batch over 1073741824 GPUs"));
  EXPECT_THAT(plan.stdout_text,
              HasSubstr("  ddp tp1 pp1 dp1073741824 mb8: train.batch_size 8 is not a multiple of "
                        "dp 1073741824 x train.micro_batch 8, which the trainer refuses\n"));
}

// A model above dtrain's parameter bound is the recipe's error, as `recipe check` and `train`
// say (exit 2), not a layout search that asks for more nodes.
TEST(PlanCommandTest, AModelAboveTheParameterBoundIsARecipeError) {
  const testing::Outcome plan = testing::RunDtrain(
      absl::StrCat("plan ", DTRAIN_SOURCE_DIR,
                   "/configs/llama-70b.yaml --set model.n_layer=1000 --set model.d_model=65536 "
                   "--set model.n_head=512 --set model.n_kv_head=8"));
  EXPECT_EQ(plan.exit_code, 2) << plan.stdout_text;
  EXPECT_THAT(plan.stderr_text, HasSubstr("above dtrain's bound of 1e+13 parameters"));
  EXPECT_EQ(plan.stdout_text, "");
}

// The catalog lists every GPU and link a recipe can name, as text and, with --json, as JSON
// whose names are the ones cluster.gpu and cluster.network take; a recipe beside --catalog is an
// error rather than ignored.
TEST(PlanCommandTest, TheCatalogListsItsNamesAsTextAndJson) {
  const testing::Outcome text = testing::RunDtrain("plan --catalog");
  ASSERT_EQ(text.exit_code, 0) << text.stderr_text;
  EXPECT_THAT(text.stdout_text, HasSubstr("h100-sxm"));
  EXPECT_THAT(text.stdout_text, HasSubstr("ib-ndr"));

  const testing::Outcome json = testing::RunDtrain("plan --catalog --json");
  ASSERT_EQ(json.exit_code, 0) << json.stderr_text;
  const nlohmann::json catalog = nlohmann::json::parse(json.stdout_text);
  ASSERT_TRUE(catalog["gpus"].is_array());
  ASSERT_TRUE(catalog["links"].is_array());
  bool h100 = false, ndr = false;
  for (const nlohmann::json& gpu : catalog["gpus"]) {
    EXPECT_THAT(text.stdout_text, HasSubstr(gpu["name"].get<std::string>()));
    if (gpu["name"] == "h100-sxm") {
      h100 = true;
      EXPECT_EQ(gpu["bf16_tflops"], 989) << gpu;
      EXPECT_EQ(gpu["dtrain_runs"], true);
    }
  }
  for (const nlohmann::json& link : catalog["links"]) {
    EXPECT_THAT(text.stdout_text, HasSubstr(link["name"].get<std::string>()));
    if (link["name"] == "ib-ndr") {
      ndr = true;
      EXPECT_EQ(link["transport"], "InfiniBand");
    }
  }
  EXPECT_TRUE(h100 && ndr) << json.stdout_text;

  const testing::Outcome with_recipe =
      testing::RunDtrain(absl::StrCat("plan --catalog ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml"));
  EXPECT_EQ(with_recipe.exit_code, 2);
  EXPECT_THAT(with_recipe.stderr_text, HasSubstr("takes no recipe"));
  EXPECT_EQ(with_recipe.stdout_text, "");
}

// A pipeline's recipe lines keep the recipe's schedule where the trainer runs it: gpt2-1.5b's 8
// sequences on 8 nodes pipeline the GPUs that replicas cannot use.
TEST(PlanCommandTest, PipelinesKeepTheRecipesSchedule) {
  const std::string path = absl::StrCat(DTRAIN_SOURCE_DIR, "/configs/gpt2-1.5b.yaml");
  const testing::Outcome one_f_one_b =
      testing::RunDtrain(absl::StrCat("plan ", path, " --set cluster.nodes=8"));
  ASSERT_EQ(one_f_one_b.exit_code, 0) << one_f_one_b.stderr_text;
  EXPECT_THAT(RecipeLinesAsOverrides(one_f_one_b.stdout_text),
              HasSubstr("--set parallel.pp_schedule=1f1b"));
  const testing::Outcome gpipe = testing::RunDtrain(
      absl::StrCat("plan ", path, " --set cluster.nodes=8 --set parallel.pp_schedule=gpipe"));
  ASSERT_EQ(gpipe.exit_code, 0) << gpipe.stderr_text;
  EXPECT_THAT(RecipeLinesAsOverrides(gpipe.stdout_text),
              HasSubstr("--set parallel.pp_schedule=gpipe"));
}

// What the trainer is asked to run, scaled down: a model of the recommendation's family small
// enough for 8 processes on a laptop whose shape still splits over its tp (heads, kv heads, MLP
// width, vocabulary, tokens under sequence parallelism) and pp (two blocks per stage), and a
// batch of two micro-batches per stage for each replica, so the pipeline fills.
std::string ScaledDownRecipe(const std::string& family, int tp, int pp, int dp, int micro_batch) {
  std::string text;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&text, "Pack my box with ", i % 7, " jugs.\n");
  const std::string data = testing::WriteTempFile("plan_train_text.txt", text);
  const int n_head = std::max(4, tp);
  const std::string model = absl::StrCat(
      "family: ", family, ", n_layer: ", 2 * pp, ", n_head: ", n_head, ", d_model: ", 8 * n_head,
      family == "llama" ? absl::StrCat(", n_kv_head: ", n_head / 2, ", d_ff: ", 16 * n_head) : "",
      ", vocab_size: 256, max_seq_len: 32");
  return testing::WriteTempFile(
      absl::StrCat("plan_train_", family, "_tp", tp, "_pp", pp, "_dp", dp, ".yaml"),
      absl::StrCat("run: {name: plan_train, seed: 3, threads: 1}\nmodel: {", model,
                   "}\ndata: {train: [", data, "]}\ntrain: {steps: 3, batch_size: ",
                   dp * micro_batch * 2 * pp, R"(, seq_len: 16, warmup_steps: 1, eval_every: 0}
parallel: {timeout_s: 60}
checkpoint: {resume: never}
logging: {sample_tokens: 0}
)"));
}

class PlanRecommendationTrainsTest : public ::testing::TestWithParam<std::string> {};

// The issue's bar: `dtrain plan` recommends no layout that `dtrain train` refuses. A shipped
// config's recommendation (strategy, tp, pp and its schedule, dp, micro-batch, recomputation,
// sequence parallelism: its recipe lines, which RecipeLinesOfEveryShippedConfigAreAValidRecipe
// checks against the config) trains 3 steps on local processes, on the CPU, with a scaled-down
// model and batch.
TEST_P(PlanRecommendationTrainsTest, ScaledDownOnLocalRanks) {
  constexpr int kMaxLocalRanks = 8;
  const std::string path = absl::StrCat(DTRAIN_SOURCE_DIR, "/configs/", GetParam(), ".yaml");
  const testing::Outcome plan = testing::RunDtrain(absl::StrCat("plan --json ", path));
  ASSERT_EQ(plan.exit_code, 0) << plan.stderr_text;
  const nlohmann::json json = nlohmann::json::parse(plan.stdout_text);
  const nlohmann::json& chosen = json["recommended"];
  // A layout with more ranks than local ranks allow keeps its tp, runs fewer pipeline stages (two
  // at least, where it has stages) and drops replicas: the kinds of parallelism and their groups
  // are what the trainer must run; the numbers of stages and replicas change only the split of
  // the blocks and the batch (llama-70b plans 8 stages of tp 4 on 8 nodes).
  const int tp = chosen["tp"], planned_pp = chosen["pp"];
  const int pp = planned_pp == 1 ? 1 : std::max(2, std::min(planned_pp, kMaxLocalRanks / tp));
  ASSERT_LE(tp * pp, kMaxLocalRanks) << "a replica of this layout does not fit on local ranks";
  const int dp = std::min(chosen["dp"].get<int>(), kMaxLocalRanks / (tp * pp));
  const std::string recipe =
      ScaledDownRecipe(json["model"]["family"], tp, pp, dp, chosen["micro_batch"]);
  const std::string out = testing::FreshTempDir("plan_train_" + GetParam());
  std::vector<std::string> sets = RecipeLinesAsSets(json["recipe_lines"]);
  // The lines are for the cluster's GPUs; the layout trains on this machine's CPU.
  const auto device = std::find(sets.begin(), sets.end(), "run.device=cuda");
  ASSERT_NE(device, sets.end());
  *device = "run.device=cpu";
  const auto stages = std::find(sets.begin(), sets.end(), absl::StrCat("parallel.pp=", planned_pp));
  ASSERT_NE(stages, sets.end());
  *stages = absl::StrCat("parallel.pp=", pp);
  sets.push_back("run.out_dir=" + out);
  SCOPED_TRACE(absl::StrCat("dp ", dp, ": ", absl::StrJoin(sets, " ")));
  const auto ranks = testing::RunTrainRanks(recipe, tp * pp * dp, sets);
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    ASSERT_EQ(ranks[rank].exit_code, 0) << "rank " << rank << ":\n" << ranks[rank].output;
  }
  const testing::RunMetrics metrics = testing::ReadRunMetrics(out + "/plan_train/metrics.jsonl");
  ASSERT_EQ(metrics.loss.size(), 3u);
  for (double loss : metrics.loss) EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
}

INSTANTIATE_TEST_SUITE_P(ShippedConfigs, PlanRecommendationTrainsTest,
                         ::testing::ValuesIn(ShippedConfigs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

}  // namespace
}  // namespace dtrain
