#include "core/recipe/recipe.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// The smallest recipe that passes: data.train is the only key without a usable default.
constexpr char kMinimal[] =
    "data:\n"
    "  train: [data/fortunes.txt]\n";

// Parses `text` (named t.yaml in messages) and returns the error message, or "" on success.
std::string ErrorOf(const std::string& text, const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<Recipe> recipe = ParseRecipe(text, "t.yaml", overrides);
  if (recipe.ok()) return "";
  EXPECT_EQ(recipe.status().code(), absl::StatusCode::kInvalidArgument) << recipe.status();
  // One message, one line.
  EXPECT_THAT(std::string(recipe.status().message()), Not(HasSubstr("\n")));
  return std::string(recipe.status().message());
}

std::string WithMinimal(const std::string& extra) { return absl::StrCat(kMinimal, extra); }

TEST(RecipeTest, DefaultsResolve) {
  absl::StatusOr<Recipe> recipe = ParseRecipe(kMinimal, "t.yaml");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  const Recipe defaults;
  EXPECT_EQ(recipe->train.lr, defaults.train.lr);
  EXPECT_EQ(recipe->model.n_layer, defaults.model.n_layer);
  EXPECT_EQ(recipe->train.no_decay, defaults.train.no_decay);
  EXPECT_EQ(recipe->logging.sample_prompt, "\n");
  EXPECT_EQ(recipe->data.train, std::vector<std::string>{"data/fortunes.txt"});
  EXPECT_EQ(recipe->source_path, "t.yaml");
  EXPECT_EQ(recipe->run_dir(), "runs/dtrain");
}

TEST(RecipeTest, ReadsEveryType) {
  absl::StatusOr<Recipe> recipe = ParseRecipe(
      "run: {seed: 18446744073709551615, name: x}\n"
      "model: {family: llama, n_kv_head: 2, d_ff: 100, norm_eps: 1e-6}\n"
      "data: {train: [a.txt, 'b c.txt'], val: []}\n"
      "train: {lr: 3e-4, no_decay: []}\n"
      "parallel: {recompute: selective, strategy: fsdp}\n",
      "t.yaml");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->run.seed, 18446744073709551615ull);
  EXPECT_EQ(recipe->model.family, "llama");
  EXPECT_EQ(recipe->n_kv_head(), 2);
  EXPECT_EQ(recipe->d_ff(), 100);
  EXPECT_DOUBLE_EQ(recipe->model.norm_eps, 1e-6);
  EXPECT_EQ(recipe->data.train, (std::vector<std::string>{"a.txt", "b c.txt"}));
  EXPECT_DOUBLE_EQ(recipe->train.lr, 3e-4);
  EXPECT_TRUE(recipe->train.no_decay.empty());
  EXPECT_EQ(recipe->parallel.recompute, "selective");
  EXPECT_EQ(recipe->parallel.strategy, "fsdp");
}

// A constant schedule stays at train.lr after warmup: a min_lr above it is no error there.
TEST(RecipeTest, AConstantScheduleTakesAnyMinLr) {
  EXPECT_EQ(ErrorOf(kMinimal, {"train.schedule=constant", "train.min_lr=1"}), "");
}

TEST(RecipeTest, DerivedFeedForwardWidth) {
  Recipe recipe;
  recipe.model.d_model = 768;
  EXPECT_EQ(recipe.d_ff(), 3072);  // gpt2: 4 * d_model
  recipe.model.family = "llama";
  recipe.model.d_model = 4096;
  EXPECT_EQ(recipe.d_ff(), 11008);  // Llama 7B: 256 * ceil(10922 / 256)
  recipe.model.d_model = 256;
  EXPECT_EQ(recipe.d_ff(), 768);  // 682 rounds up to 768
  recipe.model.d_ff = 1000;
  EXPECT_EQ(recipe.d_ff(), 1000);
}

// run.precision auto computes with bf16 parameters on cuda only; fp32 and bf16 hold anywhere.
TEST(RecipeTest, PrecisionAutoIsBf16OnCudaOnly) {
  Recipe recipe;
  EXPECT_FALSE(recipe.bf16_params());
  recipe.run.device = "cuda";
  EXPECT_TRUE(recipe.bf16_params());
  recipe.run.precision = "fp32";
  EXPECT_FALSE(recipe.bf16_params());
  recipe.run.device = "cpu";
  recipe.run.precision = "bf16";
  EXPECT_TRUE(recipe.bf16_params());
  EXPECT_THAT(ErrorOf(WithMinimal("run: {precision: fp16}\n")),
              AllOf(HasSubstr("run.precision"), HasSubstr("bf16")));
}

// bf16 parameters on the GPU multiply on the bf16 tensor cores unless the recipe says otherwise;
// on the CPU, whose sgemm gains nothing from rounded inputs, and in float32, GEMMs stay float32.
TEST(RecipeTest, MatmulPrecisionAutoIsMediumForBf16ParametersOnCuda) {
  Recipe recipe;
  EXPECT_EQ(recipe.run.matmul_precision, "auto");
  EXPECT_EQ(recipe.matmul_precision(), "highest");
  recipe.run.precision = "bf16";
  EXPECT_EQ(recipe.matmul_precision(), "highest");
  recipe.run.device = "cuda";
  EXPECT_EQ(recipe.matmul_precision(), "medium");
  recipe.run.precision = "auto";
  EXPECT_EQ(recipe.matmul_precision(), "medium");
  recipe.run.matmul_precision = "high";
  EXPECT_EQ(recipe.matmul_precision(), "high");
  recipe.run.matmul_precision = "auto";
  recipe.run.precision = "fp32";
  EXPECT_EQ(recipe.matmul_precision(), "highest");
}

// /metrics listens on an IP address, the same on every node: a name is refused where a recipe is
// loaded to run (a run warned at its start, guessing at a busy port), unless the metrics are off.
TEST(RecipeTest, TheMetricsAddressIsAnIpAddress) {
  const auto check = [](const std::string& address, int port) {
    absl::StatusOr<Recipe> recipe =
        ParseRecipe(kMinimal, "t.yaml",
                    {absl::StrCat("logging.metrics_address='", address, "'"),
                     absl::StrCat("logging.metrics_port=", port)});
    EXPECT_TRUE(recipe.ok()) << recipe.status();
    return recipe.ok() ? CheckMetricsAddress(*recipe) : recipe.status();
  };
  const absl::Status name = check("not-an-ip", 9400);
  EXPECT_EQ(name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(name.message(),
              HasSubstr("logging.metrics_address: 'not-an-ip' is no IP address (every node reads "
                        "the same recipe, and a host name is one node's): give 0.0.0.0"));
  EXPECT_TRUE(check("not-an-ip", 0).ok());  // no /metrics
  for (const char* address : {"0.0.0.0", "127.0.0.1", "::", "::1", "10.1.2.3", "localhost"}) {
    EXPECT_TRUE(check(address, 9400).ok()) << address;
  }
}

TEST(RecipeTest, UnknownKeySuggestsNearest) {
  const std::string error = ErrorOf(WithMinimal("train:\n  steps: 10\n  lrr: 0.1\n"));
  EXPECT_THAT(error, AllOf(HasSubstr("unknown key train.lrr"), HasSubstr("t.yaml:5:3"),
                           HasSubstr("did you mean train.lr?")));
}

// Other trainers' names point at dtrain's key; a name far from every key is not matched to one
// (train.learning_rate once suggested logging.metrics_file, train.grad_accum train.grad_clip).
TEST(RecipeTest, UnknownKeysOfOtherTrainersAndFarNamesGetUsefulHints) {
  EXPECT_THAT(ErrorOf(kMinimal, {"train.learning_rate=0.1"}),
              HasSubstr("(did you mean train.lr?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.lerning_rate=0.1"}), HasSubstr("(did you mean train.lr?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.learningrate=0.1"}), HasSubstr("(did you mean train.lr?)"));
  // A key of the section as close as another trainer's name wins.
  EXPECT_THAT(ErrorOf(kMinimal, {"model.max_seq_lenght=64"}),
              HasSubstr("(did you mean model.max_seq_len?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.warmup=5"}),
              HasSubstr("(did you mean train.warmup_steps?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.gradient_accumulation_steps=4"}),
              HasSubstr("set those two"));
  // Megatron-LM's and DeepSpeed's layout names.
  EXPECT_THAT(ErrorOf(kMinimal, {"tensor_model_parallel_size=2"}),
              HasSubstr("(did you mean parallel.tp?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"parallel.pipeline_model_parallel_size=2"}),
              HasSubstr("(did you mean parallel.pp?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"parallel.zero_stage=2"}),
              HasSubstr("(did you mean parallel.strategy? (zero1, zero2, zero3 or fsdp; "
                        "DeepSpeed's ZeRO stage N is zeroN))"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.totally_unrelated_thing=1"}),
              HasSubstr("(`dtrain recipe reference` lists every key)"));
  // llm.c's and nanoGPT's intervals (ckpt_every named the key list only).
  EXPECT_THAT(ErrorOf(kMinimal, {"train.ckpt_every=10"}),
              HasSubstr("(did you mean checkpoint.interval?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.val_loss_every=10"}),
              HasSubstr("(did you mean train.eval_every?)"));
}

TEST(RecipeTest, KeyInWrongSectionSuggestsItsSection) {
  EXPECT_THAT(ErrorOf(WithMinimal("model:\n  lr: 0.1\n")),
              AllOf(HasSubstr("unknown key model.lr"), HasSubstr("did you mean train.lr?")));
}

TEST(RecipeTest, UnknownSection) {
  EXPECT_THAT(ErrorOf(WithMinimal("trian:\n  steps: 10\n")),
              AllOf(HasSubstr("unknown section 'trian'"), HasSubstr("t.yaml:3:1"),
                    HasSubstr("did you mean train?")));
  EXPECT_THAT(ErrorOf(WithMinimal("lr: 0.1\n")), HasSubstr("did you mean train.lr?"));
  // Two edits turn any two-letter name into any other: no typo of lr.
  EXPECT_EQ(ErrorOf(WithMinimal("x0: 1\n")),
            "unknown section 'x0' at t.yaml:3:1; sections are run, model, data, train, parallel, "
            "checkpoint, cluster, logging");
}

TEST(RecipeTest, SectionMustBeMap) {
  EXPECT_THAT(ErrorOf(WithMinimal("train: 5\n")),
              AllOf(HasSubstr("section 'train'"), HasSubstr("t.yaml:3:8"),
                    HasSubstr("expected a map"), HasSubstr("'5'")));
}

TEST(RecipeTest, RootMustBeMap) {
  EXPECT_THAT(ErrorOf("- a\n- b\n"), HasSubstr("a recipe is a map of sections"));
}

// With the likely fix: a tab in an indentation is named (yaml-cpp says only "illegal map value"
// or the like), else the usual slips.
TEST(RecipeTest, InvalidYamlNamesLineAndTheLikelyFix) {
  EXPECT_THAT(
      ErrorOf("train:\n  steps: [1,\n"),
      AllOf(HasSubstr("t.yaml:"), HasSubstr("not valid YAML"), HasSubstr("check the indentation")));
  EXPECT_THAT(ErrorOf("train:\n  steps: 2\n\tlr: 0.1\n"),
              AllOf(HasSubstr("not valid YAML"),
                    HasSubstr("line 3 is indented with a tab: YAML indents with spaces only")));
}

TEST(RecipeTest, DuplicateKey) {
  EXPECT_THAT(
      ErrorOf(WithMinimal("train:\n  lr: 0.1\n  lr: 0.2\n")),
      AllOf(HasSubstr("train.lr at t.yaml:5:3"), HasSubstr("set twice"), HasSubstr("t.yaml:4:7")));
}

TEST(RecipeTest, WrongTypeInteger) {
  EXPECT_EQ(ErrorOf(WithMinimal("train:\n  steps: abc\n")),
            "train.steps at t.yaml:4:10: expected an integer, got 'abc'");
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  steps: 1.5\n")),
              HasSubstr("expected an integer, got '1.5'"));
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  steps: \"10\"\n")), HasSubstr("remove the quotes"));
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  steps: 99999999999\n")),
              HasSubstr("must fit in 32 bits"));
  EXPECT_THAT(ErrorOf(WithMinimal("run:\n  seed: -1\n")),
              HasSubstr("expected a non-negative integer, got '-1'"));
}

TEST(RecipeTest, WrongTypeBool) {
  EXPECT_THAT(ErrorOf(WithMinimal("parallel:\n  check_replicas: yes\n")),
              AllOf(HasSubstr("parallel.check_replicas at t.yaml:4:19"),
                    HasSubstr("expected true or false, got 'yes'")));
  EXPECT_THAT(ErrorOf(WithMinimal("parallel:\n  check_replicas: 1\n")),
              HasSubstr("expected true or false"));
}

TEST(RecipeTest, WrongTypeDouble) {
  EXPECT_EQ(ErrorOf(WithMinimal("train:\n  lr: fast\n")),
            "train.lr at t.yaml:4:7: expected a number, got 'fast'");
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  lr: [1]\n")), HasSubstr("got a list"));
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  lr: .nan\n")), HasSubstr("expected a number"));
  // strtod reads these as numbers; a recipe does not.
  for (const char* text : {"0x1p-10", "0X.1", "inf", "-nan", "1e999"}) {
    EXPECT_EQ(
        ErrorOf(kMinimal, {absl::StrCat("train.grad_clip=", text)}),
        absl::StrCat("--set train.grad_clip=", text, ": expected a number, got '", text, "'"));
  }
  EXPECT_EQ(ErrorOf(kMinimal, {"train.grad_clip=+2.5E-1"}), "");
}

// A learning rate or epsilon of 1 or more is a slip of the exponent (3e4 for 3e-4): an error
// saying what the value does, not a run whose loss grows until it overflows.
TEST(RecipeTest, RatesAndEpsilonsAreBelowOne) {
  EXPECT_EQ(ErrorOf(kMinimal, {"train.lr=3e4"}),
            "--set train.lr=3e4: must be in (0, 1), got 3e4: AdamW moves each weight by up to "
            "about lr a step; 1e-4 to 1e-3 is usual");
  EXPECT_EQ(ErrorOf(kMinimal, {"train.eps=1"}),
            "--set train.eps=1: must be in (0, 1), got 1: it keeps the denominator off 0; 1e-8 "
            "is usual");
  EXPECT_EQ(ErrorOf(kMinimal, {"model.norm_eps=1e30"}),
            "--set model.norm_eps=1e30: must be in (0, 1), got 1e30: it is added to a variance of "
            "about 1; 1e-5 is usual");
  EXPECT_EQ(ErrorOf(kMinimal, {"train.lr=0.999", "train.eps=1e-30", "model.norm_eps=0.5"}), "");
}

TEST(RecipeTest, WrongTypeList) {
  EXPECT_THAT(ErrorOf("data:\n  train: data/fortunes.txt\n"),
              AllOf(HasSubstr("data.train at t.yaml:2:10"),
                    HasSubstr("expected a list of strings like [a.txt, b.txt]"),
                    HasSubstr("got 'data/fortunes.txt'; write [\"data/fortunes.txt\"]")));
  EXPECT_THAT(ErrorOf("data:\n  train: [a, {b: c}]\n"), HasSubstr("item 2 is a map"));
}

TEST(RecipeTest, WrongTypeString) {
  EXPECT_THAT(ErrorOf(WithMinimal("run:\n  name: [a]\n")),
              AllOf(HasSubstr("run.name at t.yaml:4:9"), HasSubstr("expected a string")));
}

TEST(RecipeTest, OutOfRange) {
  EXPECT_EQ(ErrorOf(WithMinimal("train:\n  lr: 0\n")),
            "train.lr at t.yaml:4:7: must be in (0, 1), got 0: AdamW moves each weight by up to "
            "about lr a step; 1e-4 to 1e-3 is usual");
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  beta2: 1.0\n")),
              HasSubstr("train.beta2 at t.yaml:4:10: must be in [0, 1), got 1.0"));
  EXPECT_THAT(ErrorOf(WithMinimal("model:\n  n_layer: 0\n")),
              HasSubstr("must be in [1, 65536], got 0"));
  EXPECT_EQ(ErrorOf(kMinimal, {"data.val_fraction=1"}),
            "--set data.val_fraction=1: must be in [0, 1), got 1");
  EXPECT_THAT(ErrorOf(WithMinimal("logging:\n  sample_top_k: -1\n")),
              AllOf(HasSubstr("logging.sample_top_k"), HasSubstr("must be >= 0")));
}

// Sizes far beyond any model are refused where they are read, before anything allocates.
TEST(RecipeTest, ModelSizesHaveUpperBounds) {
  EXPECT_EQ(ErrorOf(WithMinimal("model:\n  n_layer: 2000000000\n")),
            "model.n_layer at t.yaml:4:12: must be in [1, 65536], got 2000000000");
  EXPECT_EQ(ErrorOf(WithMinimal("model:\n  d_model: 1000000000\n")),
            "model.d_model at t.yaml:4:12: must be in [1, 1048576], got 1000000000");
  EXPECT_THAT(ErrorOf(kMinimal, {"model.vocab_size=2000000000"}),
              HasSubstr("--set model.vocab_size=2000000000: must be in [1, 1073741824]"));
  EXPECT_EQ(ErrorOf(WithMinimal("model:\n  n_layer: 65536\n  d_ff: 4194304\n")), "");
}

// Counts that would exhaust the machine (threads, streams' open files), overflow a product or a
// clock (nodes x GPUs, a timeout in nanoseconds) or run for ever are refused where they are read.
TEST(RecipeTest, RunCountsHaveUpperBounds) {
  EXPECT_EQ(ErrorOf(kMinimal, {"run.threads=100000"}),
            "--set run.threads=100000: must be in [0, 4096], got 100000");
  EXPECT_EQ(ErrorOf(kMinimal, {"parallel.timeout_s=1e10"}),
            "--set parallel.timeout_s=1e10: must be in (0, 604800], got 1e10");
  EXPECT_EQ(ErrorOf(kMinimal, {"cluster.gpus_per_node=2147483647"}),
            "--set cluster.gpus_per_node=2147483647: must be in [1, 1024], got 2147483647");
  EXPECT_THAT(ErrorOf(kMinimal, {"cluster.nodes=2147483647"}),
              HasSubstr("must be in [1, 1048576]"));
  EXPECT_THAT(ErrorOf(kMinimal, {"data.streams=2147483647"}), HasSubstr("must be in [1, 1048576]"));
  EXPECT_THAT(ErrorOf(kMinimal, {"logging.sample_tokens=2147483647"}),
              HasSubstr("must be in [0, 1048576]"));
  EXPECT_EQ(ErrorOf(kMinimal, {"run.threads=4096", "parallel.timeout_s=604800",
                               "cluster.nodes=1048576", "cluster.gpus_per_node=1024"}),
            "");
}

TEST(RecipeTest, TextMustBeUtf8) {
  EXPECT_EQ(ErrorOf(WithMinimal("run:\n  name: \"sm\xff"
                                "all\"\n")),
            "run.name at t.yaml:4:9: byte 3 (0xff) is not valid UTF-8 ('sm\\xffall'); recipe "
            "text must be UTF-8, so save the file as UTF-8");
  EXPECT_THAT(ErrorOf("data:\n  train: [a.txt, b\xc3.txt]\n"),
              AllOf(HasSubstr("data.train at t.yaml:2:10: item 2: byte 2 (0xc3)"),
                    HasSubstr("'b\\xc3.txt'")));
  EXPECT_EQ(ErrorOf(kMinimal, {"run.name=sm\xff"
                               "all"}),
            "--set run.name=sm\\xffall: byte 12 (0xff) is not valid UTF-8; recipe text must be "
            "UTF-8, so pass the value in a UTF-8 locale");
  // UTF-8 beyond ASCII, and YAML's escapes of any code point, are text like any other.
  absl::StatusOr<Recipe> recipe = ParseRecipe(WithMinimal("run:\n  name: \"gr\xc3\xb6\xc3\x9f"
                                                          "e \\xff\"\n"),
                                              "t.yaml");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->run.name,
            "gr\xc3\xb6\xc3\x9f"
            "e \xc3\xbf");
}

// yaml-cpp continues a quoted scalar over lines, so an unclosed quote would swallow the keys
// after it; the recipe says where the quote opened instead.
TEST(RecipeTest, QuoteMustCloseOnItsLine) {
  EXPECT_EQ(ErrorOf("data:\n  train: [data/fortunes.txt]\nrun:\n  name: \"tiny\nmodel:\n"
                    "  n_layer: 3\n  d_model: 64\"\n"),
            "run.name at t.yaml:4:9: the quoted value opened on line 4 closes on line 7, so the "
            "lines between are read as part of it; close the quote on line 4");
  EXPECT_EQ(ErrorOf("data:\n  train: [data/fortunes.txt]\nrun:\n  name: 'tiny\nmodel:\n"
                    "  n_layer: 3\n"),
            "run.name at t.yaml:4:9: the quoted value opened on line 4 is never closed, so every "
            "line after it is read as part of it; close the quote on line 4");
  EXPECT_THAT(ErrorOf("data:\n  train: [\"a.txt,\n          b.txt\"]\n"),
              HasSubstr("data.train at t.yaml:2:10: item 1: the quoted value opened on line 2 "
                        "closes on line 3"));
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  lr: \"3e-4\n  steps: 5\"\n")),
              HasSubstr("train.lr at t.yaml:4:7: the quoted value opened on line 4 closes"));
  // Escaped and doubled quotes do not close a value; a block scalar may span lines.
  absl::StatusOr<Recipe> recipe =
      ParseRecipe(WithMinimal("run:\n  name: \"a \\\" b\"\n  out_dir: 'c '' d'\ntrain:\n"
                              "  schedule: 'linear'\n  init_from: \"\xc3\xa9\"\n  export_to: 'x'\n"
                              "logging:\n  sample_prompt: |\n    two\n    lines\n"),
                  "t.yaml");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->run.name, "a \" b");
  EXPECT_EQ(recipe->run.out_dir, "c ' d");
  EXPECT_EQ(recipe->train.schedule, "linear");
  EXPECT_EQ(recipe->train.export_to, "x");
  // After a character of two bytes, the check still finds the quote it looks at.
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  init_from: \"\xc3\xa9\"\n  export_to: 'x\n"
                                  "  schedule: linear'\n")),
              HasSubstr("train.export_to at t.yaml:5:14: the quoted value opened on line 5"));
  EXPECT_EQ(recipe->logging.sample_prompt, "two\nlines\n");
}

TEST(RecipeTest, EnumValueNotAllowed) {
  EXPECT_EQ(ErrorOf(WithMinimal("parallel:\n  strategy: zero4\n")),
            "parallel.strategy at t.yaml:4:13: 'zero4' is not allowed; use one of ddp, zero1, "
            "zero2, zero3, fsdp, auto");
  EXPECT_THAT(ErrorOf(WithMinimal("model:\n  family: bert\n")),
              HasSubstr("use one of gpt2, llama"));
}

// Each consistency rule, through overrides so each case is one line.
struct ConsistencyCase {
  std::vector<std::string> overrides;
  std::vector<std::string> expected;  // substrings of the message
};

class RecipeConsistencyTest : public ::testing::TestWithParam<ConsistencyCase> {};

// data.val_fraction splits token files; WebDataset's validation data is data.val_shards, so a
// val_fraction of 0 there is no reason to refuse evaluations.
TEST(RecipeTest, WebDatasetEvaluatesOnItsValShardsWhateverTheValFraction) {
  const std::vector<std::string> webdataset = {"data.format=webdataset", "data.shards=t-{0..1}.tar",
                                               "data.val_fraction=0", "train.eval_every=10"};
  EXPECT_THAT(ErrorOf(kMinimal, webdataset), HasSubstr("has no data.val_shards"));
  std::vector<std::string> with_val = webdataset;
  with_val.push_back("data.val_shards=v.tar");
  EXPECT_EQ(ErrorOf(kMinimal, with_val), "");
}

TEST_P(RecipeConsistencyTest, NamesKeyAndFix) {
  const std::string error = ErrorOf(kMinimal, GetParam().overrides);
  ASSERT_FALSE(error.empty());
  for (const std::string& part : GetParam().expected) EXPECT_THAT(error, HasSubstr(part));
}

INSTANTIATE_TEST_SUITE_P(
    Rules, RecipeConsistencyTest,
    ::testing::Values(
        ConsistencyCase{
            {"model.d_model=100", "model.n_head=3"},
            {"--set model.d_model=100", "not divisible by model.n_head (3)", "multiple of n_head"}},
        ConsistencyCase{{"model.family=llama", "model.n_kv_head=3"},
                        {"--set model.n_kv_head=3", "model.n_head (4)", "divisor of n_head"}},
        ConsistencyCase{{"model.n_kv_head=2"},
                        {"model.n_kv_head", "only the llama family", "model.family: llama"}},
        ConsistencyCase{{"model.family=llama", "model.d_model=12", "model.n_head=4"},
                        {"model.n_head", "= 3", "RoPE", "even"}},
        ConsistencyCase{{"train.batch_size=10", "train.micro_batch=4"},
                        {"train.batch_size", "train.micro_batch (4)", "multiple of micro_batch",
                         "train.batch_size: 8 or 12, or train.micro_batch: 2 or 5)"}},
        ConsistencyCase{{"train.batch_size=3", "train.micro_batch=4"},
                        {"train.batch_size: 4, or train.micro_batch: 3)"}},
        ConsistencyCase{
            {"train.seq_len=512"},
            {"--set train.seq_len=512", "model.max_seq_len (256)", "raise max_seq_len"}},
        ConsistencyCase{{"train.min_lr=0.1"}, {"train.min_lr", "train.lr", "min_lr <= lr"}},
        ConsistencyCase{{"data.train=[]"}, {"data.train", "no training files"}},
        ConsistencyCase{{"model.vocab_size=100"},
                        {"model.vocab_size", "data.format text", "vocab_size >= 256"}},
        // run.name is one folder under run.out_dir.
        ConsistencyCase{{"run.name="}, {"run.name", "'' is not a folder name"}},
        ConsistencyCase{{"run.name=../../etc"}, {"run.name", "without '/'"}},
        ConsistencyCase{{"data.val_fraction=0"},
                        {"train.eval_every", "no validation data", "eval_every: 0"}},
        // parallel.tp: the model's shape must split over it; the nearest sizes that fit.
        ConsistencyCase{{"parallel.tp=3"},
                        {"--set parallel.tp=3", "model.n_head = 4",
                         "make model.n_head a multiple of it; or, for this model, set "
                         "parallel.tp: 2 or 4"}},
        ConsistencyCase{{"parallel.tp=4", "model.d_ff=102"},
                        {"parallel.tp", "model.d_ff = 102",
                         "set model.d_ff to a multiple of it; or, for this model, set "
                         "parallel.tp: 2 (the nearest sizes that fit)"}},
        ConsistencyCase{
            {"model.family=llama", "model.n_head=12", "model.n_kv_head=4", "model.d_model=96",
             "model.d_ff=120", "parallel.tp=6"},
            {"parallel.tp", "model.n_kv_head = 4 and parallel.tp = 6", "parallel.tp: 4 or 12"}},
        ConsistencyCase{{"parallel.tp=2", "parallel.strategy=auto"},
                        {"parallel.strategy", "auto picks the tensor-parallel degree itself",
                         "parallel.tp: 1"}},
        // Sequence parallelism splits every sequence's tokens over the tp ranks: the nearest
        // seq_len multiples of tp, and the nearest tp sizes dividing seq_len that fit the model.
        ConsistencyCase{
            {"parallel.tp=4", "parallel.sequence_parallel=true", "train.seq_len=126"},
            {"--set parallel.sequence_parallel=true", "train.seq_len = 126", "parallel.tp = 4",
             "train.seq_len: 124 or 128", "parallel.tp: 2,", "parallel.sequence_parallel: false"}},
        ConsistencyCase{
            {"parallel.tp=2", "parallel.sequence_parallel=true", "train.seq_len=1"},
            {"train.seq_len = 1 ", "train.seq_len: 2,", "parallel.sequence_parallel: false"}},
        ConsistencyCase{
            {"parallel.pp=2", "parallel.strategy=auto"},
            {"parallel.strategy", "auto picks the pipeline degree itself", "parallel.pp: 1"}},
        // The pipeline keys: checked before that, so a recipe learns every fix it needs.
        ConsistencyCase{{"parallel.pp=8"},
                        {"--set parallel.pp=8", "8 stages exceed the model.n_layer = 4 blocks",
                         "parallel.pp to at most 4"}},
        ConsistencyCase{
            {"parallel.pp_virtual_stages=2"},
            {"--set parallel.pp_virtual_stages=2",
             "needs parallel.pp_schedule: interleaved (it is 1f1b)", "or pp_virtual_stages: 1"}},
        ConsistencyCase{{"parallel.pp_schedule=interleaved", "parallel.pp_virtual_stages=2"},
                        {"parallel.pp_virtual_stages", "parallel.pp is 1"}},
        ConsistencyCase{
            {"parallel.pp_schedule=interleaved", "parallel.pp=2", "parallel.pp_virtual_stages=3"},
            {"parallel.pp_virtual_stages", "3 does not divide the 2 blocks per stage",
             "nearest values that fit: parallel.pp_virtual_stages: 2)"}},
        ConsistencyCase{
            {"model.n_layer=12", "parallel.pp_schedule=interleaved", "parallel.pp=4",
             "parallel.pp_virtual_stages=2"},
            {"2 does not divide the 3 blocks per stage", "parallel.pp_virtual_stages: 1 or 3)"}},
        ConsistencyCase{{"model.n_layer=10", "parallel.pp_schedule=interleaved", "parallel.pp=4",
                         "parallel.pp_virtual_stages=2"},
                        {"model.n_layer = 10 is not a multiple of parallel.pp = 4",
                         "parallel.pp_virtual_stages: 1)"}},
        ConsistencyCase{
            {"parallel.pp_schedule=zb"},
            {"parallel.pp_schedule", "'zb' is not allowed", "1f1b, interleaved, gpipe"}}));

// Under parallel.strategy auto, which picks parallel.pp, interleaved chunks are the search's to
// place: pp stays 1 (each error's fix led to the other's).
TEST(RecipeTest, AutoTakesInterleavedChunksWithoutAPipelineDegree) {
  absl::StatusOr<Recipe> recipe =
      ParseRecipe(kMinimal, "t.yaml",
                  {"parallel.strategy=auto", "parallel.pp_schedule=interleaved",
                   "parallel.pp_virtual_stages=2"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->parallel.pp_virtual_stages, 2);
}

// The recipe accepts cuda wherever it runs; whether a GPU is there is checked at start-up
// (core/backend/make_backend.h), not by the recipe, so `dtrain plan` works on a laptop.
TEST(RecipeTest, CudaIsADevice) {
  absl::StatusOr<Recipe> recipe = ParseRecipe(kMinimal, "t.yaml", {"run.device=cuda"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->run.device, "cuda");
}

TEST(RecipeTest, TensorParallelSizesThatFitTheModelAreAccepted) {
  absl::StatusOr<Recipe> recipe = ParseRecipe(kMinimal, "t.yaml", {"parallel.tp=4"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->parallel.tp, 4);
  // Llama's 2 kv heads are replicated over 4 ranks.
  EXPECT_TRUE(
      ParseRecipe(kMinimal, "t.yaml", {"model.family=llama", "model.n_kv_head=2", "parallel.tp=4"})
          .ok());
}

TEST(RecipeTest, SequenceParallelNeedsTpDividingSeqLen) {
  absl::StatusOr<Recipe> recipe =
      ParseRecipe(WithMinimal("parallel:\n  tp: 4\n  sequence_parallel: true\n"), "t.yaml", {});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_TRUE(recipe->parallel.sequence_parallel);
  EXPECT_FALSE(Recipe().parallel.sequence_parallel);
  EXPECT_THAT(ErrorOf(WithMinimal("parallel:\n  tp: 4\n  sequence_parallel: true\n"),
                      {"train.seq_len=130"}),
              AllOf(HasSubstr("parallel.sequence_parallel at t.yaml:5:22"),
                    HasSubstr("train.seq_len: 128 or 132")));
}

// As in Megatron, sequence parallelism at tp 1 (nothing to split) warns and runs without it.
// A key that another makes moot is a warning naming it and the other; defaults are not.
TEST(RecipeTest, KeysWithoutEffectWarn) {
  const auto warnings = [](const std::vector<std::string>& overrides) {
    ::testing::internal::CaptureStderr();
    const absl::StatusOr<Recipe> recipe = ParseRecipe(kMinimal, "t.yaml", overrides);
    const std::string text = ::testing::internal::GetCapturedStderr();
    EXPECT_TRUE(recipe.ok()) << recipe.status();
    return text;
  };
  EXPECT_EQ(warnings({}), "");
  EXPECT_EQ(warnings({"data.streams=64"}), "");  // the default
  EXPECT_THAT(warnings({"data.streams=4"}),
              HasSubstr("--set data.streams=4: has no effect with data.format text; remove it"));
  EXPECT_THAT(warnings({"data.val=[v.txt]", "data.val_fraction=0.2"}),
              HasSubstr("has no effect when data.val is set"));
  EXPECT_THAT(warnings({"model.rope_theta=500000"}),
              HasSubstr("has no effect with model.family gpt2, whose positions are learned"));
  EXPECT_THAT(warnings({"train.schedule=constant", "train.min_lr=0.5"}),
              HasSubstr("--set train.min_lr=0.5: has no effect with train.schedule constant"));
  EXPECT_THAT(warnings({"data.packing=false"}), HasSubstr("has no effect with data.format text"));
}

TEST(RecipeTest, SequenceParallelAtTp1WarnsAndHasNoEffect) {
  ::testing::internal::CaptureStderr();
  absl::StatusOr<Recipe> recipe =
      ParseRecipe(WithMinimal("parallel:\n  sequence_parallel: true\n"), "t.yaml");
  const std::string warning = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_THAT(warning, AllOf(HasSubstr("parallel.sequence_parallel at t.yaml:4:22"),
                             HasSubstr("no effect with parallel.tp: 1")));
  // A seq_len that tp 1 trivially divides: no error either.
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(
      ParseRecipe(kMinimal, "t.yaml", {"parallel.sequence_parallel=true", "train.seq_len=127"})
          .ok());
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("no effect"));
}

TEST(RecipeTest, ConsistencyNamesFileLocation) {
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  seq_len: 512\n")),
              AllOf(HasSubstr("train.seq_len at t.yaml:4:12"), HasSubstr("model.max_seq_len")));
  // A default that conflicts says so.
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  micro_batch: 5\n")),
              HasSubstr("train.batch_size (default, not set in t.yaml): 16 is not a multiple"));
}

// A run shorter than its warmup (a smoke test: --set train.steps=5) warns that it ends in its
// warmup, as Hugging Face's schedules let it, and names where the warmup was set.
TEST(RecipeTest, ARunShorterThanItsWarmupWarns) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ErrorOf(WithMinimal("train:\n  steps: 5\n")), "");
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("train.warmup_steps (default, not set in t.yaml): 20 is more than "
                        "train.steps (5): the run ends in its warmup, at 25% of train.lr"));
}

TEST(RecipeTest, OverridesWinOverFile) {
  absl::StatusOr<Recipe> recipe =
      ParseRecipe(WithMinimal("train:\n  lr: 0.1\n  steps: 50\n"), "t.yaml",
                  {"train.lr=0.01", "data.train=[x.txt, y.txt]", "run.name=hello world",
                   "parallel.recompute=full", "train.init_from="});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_DOUBLE_EQ(recipe->train.lr, 0.01);
  EXPECT_EQ(recipe->train.steps, 50);
  EXPECT_EQ(recipe->data.train, (std::vector<std::string>{"x.txt", "y.txt"}));
  EXPECT_EQ(recipe->run.name, "hello world");
  EXPECT_EQ(recipe->parallel.recompute, "full");
  EXPECT_EQ(recipe->train.init_from, "");
}

TEST(RecipeTest, RecomputeTakesNoneSelectiveOrFull) {
  EXPECT_EQ(ParseRecipe(kMinimal, "t.yaml")->parallel.recompute, "none");
  EXPECT_THAT(ErrorOf(WithMinimal("parallel:\n  recompute: attention\n")),
              AllOf(HasSubstr("parallel.recompute at t.yaml:4:14"),
                    HasSubstr("'attention' is not allowed; use one of none, selective, full")));
}

// Fewer micro-batches than stages is allowed, with a warning about the bubble.
TEST(RecipeTest, FewerMicroBatchesThanStagesWarnOfTheBubble) {
  ::testing::internal::CaptureStderr();
  const std::string error =
      ErrorOf(kMinimal, {"parallel.pp=4", "train.batch_size=6", "train.micro_batch=2"});
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(warning, AllOf(HasSubstr("train.batch_size / train.micro_batch = 3 micro-batches "
                                       "per step, fewer than parallel.pp = 4 stages"),
                             HasSubstr("idles at least 3 of every 6 micro-batch slots"),
                             HasSubstr("raise train.batch_size or lower train.micro_batch to 4 or "
                                       "more micro-batches")));
  EXPECT_EQ(error, "");  // pp > 1 runs
  // At micro-batches of 1 only a larger batch helps.
  ::testing::internal::CaptureStderr();
  ErrorOf(kMinimal, {"parallel.pp=4", "train.batch_size=2", "train.micro_batch=1"});
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("(the bubble); raise train.batch_size to 4 or more micro-batches"));

  ::testing::internal::CaptureStderr();
  ErrorOf(kMinimal, {"parallel.pp=2", "train.batch_size=4", "train.micro_batch=2"});
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), Not(HasSubstr("bubble")));
}

// The bool that parallel.recompute replaced still reads, from the file and from --set, with a
// warning that names the new spelling.
TEST(RecipeTest, ActivationCheckpointingReadsAsRecomputeWithAWarning) {
  ::testing::internal::CaptureStderr();
  absl::StatusOr<Recipe> on =
      ParseRecipe(WithMinimal("parallel:\n  activation_checkpointing: true\n"), "t.yaml");
  const std::string warning = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->parallel.recompute, "full");
  EXPECT_THAT(warning, AllOf(HasSubstr("parallel.activation_checkpointing at t.yaml:4:29"),
                             HasSubstr("deprecated; read as parallel.recompute: full")));

  absl::StatusOr<Recipe> off =
      ParseRecipe(WithMinimal("parallel:\n  activation_checkpointing: false\n"), "t.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->parallel.recompute, "none");

  // --set overrides the file, in either spelling.
  absl::StatusOr<Recipe> set = ParseRecipe(WithMinimal("parallel:\n  recompute: selective\n"),
                                           "t.yaml", {"parallel.activation_checkpointing=true"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->parallel.recompute, "full");

  EXPECT_THAT(ErrorOf(WithMinimal("parallel:\n  activation_checkpointing: yes\n")),
              AllOf(HasSubstr("parallel.activation_checkpointing at t.yaml:4:29"),
                    HasSubstr("expected true or false, got 'yes'"),
                    HasSubstr("replace it with parallel.recompute")));
  EXPECT_THAT(ErrorOf(WithMinimal("parallel:\n  recompute: full\n  activation_checkpointing: "
                                  "true\n")),
              HasSubstr("keep only parallel.recompute"));
  EXPECT_THAT(ErrorOf(WithMinimal("parallel:\n  activation_checkpointing: true\n  recompute: "
                                  "full\n")),
              HasSubstr("parallel.recompute at t.yaml:5:3: set twice (first at t.yaml:4:29)"));
}

TEST(RecipeTest, OverrideOfUnknownKey) {
  EXPECT_EQ(ErrorOf(kMinimal, {"train.lrr=0.1"}),
            "--set train.lrr=0.1: unknown key train.lrr (did you mean train.lr?)");
  EXPECT_THAT(ErrorOf(kMinimal, {"steps=5"}), HasSubstr("did you mean train.steps?"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.lr"}), HasSubstr("expected key=value"));
}

TEST(RecipeTest, OverrideWithBadType) {
  EXPECT_EQ(ErrorOf(kMinimal, {"train.lr=abc"}),
            "--set train.lr=abc: expected a number, got 'abc'");
  EXPECT_THAT(ErrorOf(kMinimal, {"train.steps=1.5"}),
              AllOf(HasSubstr("--set train.steps=1.5"), HasSubstr("expected an integer")));
  EXPECT_THAT(ErrorOf(kMinimal, {"data.train=[a"}),
              AllOf(HasSubstr("--set data.train=[a"), HasSubstr("not valid YAML")));
}

// The fix a value that is not YAML gets is one that works: a list key's value quoted inside a
// list, another key's quoted alone.
TEST(RecipeTest, OverrideThatIsNotYamlGetsAFixThatParses) {
  EXPECT_THAT(ErrorOf(kMinimal, {"train.no_decay=*.bias"}),
              HasSubstr("quote it, e.g. '[\"*.bias\"]'"));
  EXPECT_EQ(ErrorOf(kMinimal, {"train.no_decay=[\"*.bias\"]"}), "");
  EXPECT_THAT(ErrorOf(kMinimal, {"run.name=*x"}), HasSubstr("quote it, e.g. '\"*x\"'"));
  EXPECT_EQ(ErrorOf(kMinimal, {"run.name=\"*x\""}), "");
}

// A value YAML reads as other than its text is refused, with the quoting that keeps it: it was
// taken silently, `run.out_dir=#scratch` as an empty folder (the file system's root).
TEST(RecipeTest, OverrideThatYamlReadsOtherwiseIsRefused) {
  EXPECT_EQ(ErrorOf(kMinimal, {"run.out_dir=#scratch"}),
            "--set run.out_dir=#scratch: YAML reads the value as empty ('#' starts a comment; '&', "
            "'!', '|', '>' and '%' have meanings of their own); quote it, e.g. '\"#scratch\"'");
  EXPECT_THAT(ErrorOf(kMinimal, {"run.name=lr 3e-4 #2"}),
              HasSubstr("YAML reads the value as 'lr 3e-4'"));
  EXPECT_THAT(ErrorOf(kMinimal, {"run.name=&x y"}), HasSubstr("YAML reads the value as 'y'"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.no_decay=|"}), HasSubstr("quote it, e.g. '[\"|\"]'"));
  // ": " makes a map, brackets a list, where the key takes text.
  EXPECT_EQ(ErrorOf(kMinimal, {"logging.sample_prompt=hello: world"}),
            "--set logging.sample_prompt=hello: world: YAML reads the value as a map (': ' "
            "separates a key from its value); quote it, e.g. '\"hello: world\"'");
  EXPECT_THAT(
      ErrorOf(kMinimal, {"run.name=[a]"}),
      HasSubstr("YAML reads the value as a list ('[' opens one); quote it, e.g. '\"[a]\"'"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.no_decay=a: b"}), HasSubstr("quote it, e.g. '[\"a: b\"]'"));
  EXPECT_EQ(ErrorOf(kMinimal, {"logging.sample_prompt=\"hello: world\""}), "");
  EXPECT_THAT(ErrorOf(kMinimal, {"train.steps=a: b"}), HasSubstr("expected"));
  // What YAML reads as written, or quoted, is taken.
  for (const std::string value : {"3e-4", "a#b", "\"lr 3e-4 #2\"", "'#x'", "runs/a b", "a:b"}) {
    EXPECT_EQ(ErrorOf(kMinimal, {"run.out_dir=" + value}), "") << value;
  }
  for (const std::string value : {"[a, b]", "~", ""}) {
    EXPECT_EQ(ErrorOf(kMinimal, {"train.no_decay=" + value}), "") << value;
  }
}

// A NUL (YAML's "\0") would end a path or name where the recipe does not show it.
TEST(RecipeTest, ANulCharacterIsRefused) {
  EXPECT_EQ(ErrorOf(kMinimal, {"run.name=\"x\\0y\""}),
            "--set run.name=\"x\\0y\": a NUL character at byte 2, where a path or name would "
            "end; remove it");
  EXPECT_THAT(ErrorOf(WithMinimal("train:\n  no_decay: [a, \"b\\0\"]\n")),
              HasSubstr("item 2: a NUL character at byte 2"));
}

// An empty run.out_dir would put the run folder at the file system's root.
TEST(RecipeTest, AnEmptyOutDirIsRefused) {
  EXPECT_THAT(ErrorOf(kMinimal, {"run.out_dir="}),
              HasSubstr("would put the run folder at the file system's root"));
  EXPECT_THAT(ErrorOf(WithMinimal("run:\n  out_dir: ''\n")),
              HasSubstr("would put the run folder at the file system's root"));
}

TEST(RecipeTest, MissingFileNamesPath) {
  absl::StatusOr<Recipe> recipe = LoadRecipe("/nonexistent/dir/r.yaml");
  ASSERT_FALSE(recipe.ok());
  EXPECT_EQ(recipe.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(recipe.status().message()), HasSubstr("/nonexistent/dir/r.yaml"));
}

TEST(RecipeTest, DirectoryAsRecipePathSaysSo) {
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<Recipe> recipe = LoadRecipe(dir);
  ASSERT_FALSE(recipe.ok());
  EXPECT_EQ(recipe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(recipe.status().message()),
              AllOf(HasSubstr(absl::StrCat("the recipe path '", dir, "' is a directory")),
                    Not(HasSubstr("data.train"))));
}

// train.init_from's Hugging Face folder sets the model keys the recipe leaves unset from its
// config.json (transformers' defaults for absent fields), as from_pretrained does; the recipe's
// own keys stay, for the start to check. A value of the folder is named as its field where it
// is wrong; a recipe of another family, and a folder without config.json, take none.
TEST(RecipeTest, InitFromAFolderSetsTheModelKeysTheRecipeLeavesUnset) {
  const std::string folder = absl::StrCat(::testing::TempDir(), "/fill_from_folder");
  std::filesystem::create_directories(folder);
  const auto write_config = [&](const std::string& json) {
    std::ofstream(folder + "/config.json") << json;
  };
  write_config(R"({"model_type": "llama", "num_hidden_layers": 16, "num_attention_heads": 32,
      "num_key_value_heads": 8, "hidden_size": 2048, "intermediate_size": 8192,
      "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
      "rope_theta": 500000.0})");
  const std::string init_from = "train.init_from=" + folder;
  absl::StatusOr<Recipe> recipe =
      ParseRecipe(WithMinimal("model:\n  n_layer: 3\n"), "t.yaml", {init_from});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->model.family, "llama");
  EXPECT_EQ(recipe->model.n_layer, 3);
  EXPECT_EQ(recipe->model.n_head, 32);
  EXPECT_EQ(recipe->model.n_kv_head, 8);
  EXPECT_EQ(recipe->model.d_model, 2048);
  EXPECT_EQ(recipe->model.d_ff, 8192);
  EXPECT_EQ(recipe->model.vocab_size, 128256);
  EXPECT_EQ(recipe->model.max_seq_len, 131072);
  EXPECT_DOUBLE_EQ(recipe->model.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(recipe->model.rope_theta, 500000);

  // GPT-2's config.json leaves n_inner null: 4 x n_embd, as transformers reads it.
  write_config(R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2,
      "n_inner": null, "vocab_size": 256, "n_positions": 128})");
  recipe = ParseRecipe(kMinimal, "t.yaml", {init_from});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->model.family, "gpt2");
  EXPECT_EQ(recipe->model.d_model, 64);
  EXPECT_EQ(recipe->model.d_ff, 256);
  EXPECT_EQ(recipe->model.max_seq_len, 128);
  EXPECT_EQ(recipe->model.n_layer, 2);
  EXPECT_DOUBLE_EQ(recipe->model.norm_eps, 1e-5);

  // The recipe's family is the start's to compare: another folder's shape is not taken.
  recipe = ParseRecipe(WithMinimal("model:\n  family: llama\n"), "t.yaml", {init_from});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->model.d_model, Recipe().model.d_model);

  write_config(R"({"model_type": "gpt2", "n_embd": 64, "n_head": 3})");
  EXPECT_THAT(ErrorOf(kMinimal, {init_from}),
              HasSubstr(absl::StrCat("model.d_model from ", folder,
                                     "/config.json's n_embd (train.init_from)")));
  write_config(R"({"model_type": "mistral"})");
  EXPECT_THAT(ErrorOf(kMinimal, {init_from}),
              HasSubstr("model_type \"mistral\" is not a family dtrain runs (gpt2, llama)"));
  write_config("not json");
  EXPECT_THAT(
      ErrorOf(kMinimal, {init_from}),
      HasSubstr(absl::StrCat("--set ", init_from, ": ", folder, "/config.json is not valid JSON")));

  std::filesystem::remove(folder + "/config.json");
  recipe = ParseRecipe(kMinimal, "t.yaml", {init_from});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->model.d_model, Recipe().model.d_model);
}

void ExpectSameValues(const Recipe& a, const Recipe& b) {
  // The resolved text prints every key, so equal text means equal values.
  Recipe a_copy = a, b_copy = b;
  a_copy.source_path = b_copy.source_path = "";
  EXPECT_EQ(ResolvedRecipeYaml(a_copy), ResolvedRecipeYaml(b_copy));
}

// A path that starts with '~' is refused naming the key (only a shell expands '~'; a run made a
// folder named '~'); a '~' inside a path is a name. The parser itself takes it, so that a stored
// recipe with such a path still reads back.
TEST(RecipeTest, APathStartingWithATildeIsRefused) {
  const auto tilde_error = [](const std::string& text, const std::vector<std::string>& sets) {
    const absl::StatusOr<Recipe> recipe = ParseRecipe(text, "t.yaml", sets);
    EXPECT_TRUE(recipe.ok()) << recipe.status();
    return recipe.ok() ? std::string(CheckNoTildePaths(*recipe).message()) : "";
  };
  EXPECT_THAT(tilde_error(kMinimal, {"run.out_dir=~/runs"}),
              HasSubstr("run.out_dir: '~/runs' starts with '~', which only a shell expands"));
  EXPECT_THAT(tilde_error("data:\n  train: [a.txt, '~/b.txt']\n", {}),
              HasSubstr("data.train: '~/b.txt'"));
  EXPECT_THAT(tilde_error(kMinimal, {"checkpoint.dir=~other/ckpt"}),
              AllOf(HasSubstr("checkpoint.dir"), HasSubstr("write the full path")));
  EXPECT_THAT(tilde_error(kMinimal, {"train.init_from=~/gpt2"}), HasSubstr("train.init_from"));
  EXPECT_EQ(tilde_error(kMinimal, {"run.out_dir=runs/~x"}), "");
}

TEST(RecipeTest, ResolvedYamlRoundTrips) {
  absl::StatusOr<Recipe> recipe = ParseRecipe(
      kMinimal, "t.yaml",
      {"run.name='odd: \"name\" # here'", "logging.sample_prompt=\"\\ttab\\\\ \\x01 é\"",
       "train.lr=0.000123456789", "run.seed=18446744073709551615", "data.val=[true, '123']",
       "train.init_from=null", "run.out_dir=-x"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->run.name, "odd: \"name\" # here");
  EXPECT_EQ(recipe->logging.sample_prompt, "\ttab\\ \x01 é");

  const std::string resolved = ResolvedRecipeYaml(*recipe);
  absl::StatusOr<Recipe> again = ParseRecipe(resolved, "resolved.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << resolved;
  ExpectSameValues(*recipe, *again);
  EXPECT_EQ(again->logging.sample_prompt, recipe->logging.sample_prompt);
  EXPECT_EQ(again->run.seed, recipe->run.seed);
  EXPECT_EQ(again->train.lr, recipe->train.lr);
  EXPECT_EQ(again->data.val, (std::vector<std::string>{"true", "123"}));
  EXPECT_EQ(again->train.init_from, "");  // YAML null reads as an empty string
}

TEST(RecipeTest, ResolvedYamlListsEveryKeyWithDoc) {
  absl::StatusOr<Recipe> recipe = ParseRecipe(kMinimal, "t.yaml");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  const std::string resolved = ResolvedRecipeYaml(*recipe);
  EXPECT_THAT(resolved, HasSubstr("\ntrain:\n  steps: 200"));
  EXPECT_THAT(resolved, HasSubstr("lr: 0.001"));
  EXPECT_THAT(resolved, HasSubstr("no_decay: [\"*.bias\", \"*norm*\"]"));
  EXPECT_THAT(resolved, HasSubstr("sample_prompt: \"\\n\""));
  EXPECT_THAT(resolved, HasSubstr("# peak learning rate"));
}

TEST(RecipeTest, ReferenceMarkdownHasEveryKey) {
  const std::string reference = RecipeReferenceMarkdown();
  EXPECT_THAT(reference, HasSubstr("| key | type | default | meaning |"));
  EXPECT_THAT(reference, HasSubstr("| `train.lr` | float in (0, 1) | `0.001` |"));
  EXPECT_THAT(reference,
              HasSubstr("| `parallel.strategy` | one of ddp, zero1, zero2, zero3, fsdp, auto |"));
  EXPECT_THAT(reference, HasSubstr("| `train.beta1` | float in [0, 1) |"));
  EXPECT_THAT(reference, HasSubstr("| `run.seed` | uint64 | `1337` |"));
  // Every key of the resolved recipe appears in the reference.
  absl::StatusOr<Recipe> recipe = ParseRecipe(kMinimal, "t.yaml");
  ASSERT_TRUE(recipe.ok());
  std::string section;
  std::istringstream lines(ResolvedRecipeYaml(*recipe));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] != ' ') {
      section = line.substr(0, line.find(':'));
      continue;
    }
    const std::string key = line.substr(2, line.find(':') - 2);
    EXPECT_THAT(reference, HasSubstr(absl::StrCat("`", section, ".", key, "`")));
  }
}

TEST(RecipeTest, EveryShippedConfigPasses) {
  int count = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(DTRAIN_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    absl::StatusOr<Recipe> recipe = LoadRecipe(entry.path().string());
    EXPECT_TRUE(recipe.ok()) << entry.path() << ": " << recipe.status();
  }
  EXPECT_GE(count, 9);
}

TEST(RecipeTest, ShippedShapes) {
  const std::string configs = std::string(DTRAIN_SOURCE_DIR) + "/configs/";
  absl::StatusOr<Recipe> tiny = LoadRecipe(configs + "tiny.yaml");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->run.name, "tiny");
  EXPECT_EQ(tiny->train.steps, 600);
  EXPECT_EQ(tiny->model.d_model, 256);
  absl::StatusOr<Recipe> llama = LoadRecipe(configs + "llama-70b.yaml");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->n_kv_head(), 8);
  EXPECT_EQ(llama->d_ff(), 28672);
  absl::StatusOr<Recipe> llama_tiny = LoadRecipe(configs + "llama-tiny.yaml");
  ASSERT_TRUE(llama_tiny.ok()) << llama_tiny.status();
  EXPECT_EQ(llama_tiny->d_ff(), 768);
}

}  // namespace
}  // namespace dtrain
