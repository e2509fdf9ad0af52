// Runs the dtrain binary: exit codes and what goes to stdout for the recipe commands.
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::Outcome;
using testing::RunDtrain;

TEST(CliTest, RecipeCheckOnBadRecipeExits2) {
  const std::string path =
      testing::WriteTempFile("bad.yaml", "data:\n  train: [x]\ntrain:\n  lrr: 1\n");
  const Outcome outcome = RunDtrain(absl::StrCat("recipe check ", path));
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("did you mean train.lr?"));
  EXPECT_EQ(outcome.stdout_text, "");
}

TEST(CliTest, RecipeCheckPrintsResolvedRecipe) {
  const Outcome outcome = RunDtrain(
      absl::StrCat("recipe check ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set train.steps=70"));
  EXPECT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
  EXPECT_THAT(outcome.stdout_text, HasSubstr("  steps: 70"));
  EXPECT_THAT(outcome.stdout_text, HasSubstr("  name: tiny"));
}

TEST(CliTest, RecipeCheckBadOverrideExits2) {
  const Outcome outcome = RunDtrain(
      absl::StrCat("recipe check ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set train.lr=abc"));
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("--set train.lr=abc: expected a number"));
}

// --set takes one value an occurrence, so flags may come first, as torchrun's users write them: the
// recipe after them is the recipe, not a second override.
TEST(CliTest, OverridesMayComeBeforeTheRecipe) {
  const std::string recipe = absl::StrCat(DTRAIN_SOURCE_DIR, "/configs/tiny.yaml");
  const Outcome plan = RunDtrain(absl::StrCat("plan --set train.lr=0.01 ", recipe));
  EXPECT_EQ(plan.exit_code, 0) << plan.stderr_text;
  const Outcome check = RunDtrain(absl::StrCat(
      "recipe check --set train.lr=0.01 --set train.steps=7 ", recipe, " --set train.seq_len=32"));
  ASSERT_EQ(check.exit_code, 0) << check.stderr_text;
  EXPECT_THAT(check.stdout_text, HasSubstr("steps: 7"));
  EXPECT_THAT(check.stdout_text, HasSubstr("seq_len: 32"));
  // A second KEY=VALUE after one --set says how to write it.
  const Outcome two =
      RunDtrain(absl::StrCat("recipe check ", recipe, " --set train.steps=7 train.lr=0.01"));
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_EQ(two.stderr_text, "error: --set takes one KEY=VALUE: write --set train.lr=0.01\n");
}

// A shard pattern that does not expand is a usage error at once, naming the key, from `recipe
// check` and `train` (check accepted it; train exited 1 at the first read, which launch restarts).
TEST(CliTest, AShardPatternThatDoesNotExpandExits2) {
  const std::string sets =
      " --set data.format=webdataset --set data.train=[] --set train.eval_every=0 --set "
      "data.shards=/d/s-{0..3.tar";
  for (const char* command : {"recipe check", "train"}) {
    const Outcome outcome =
        RunDtrain(absl::StrCat(command, " ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml", sets));
    EXPECT_EQ(outcome.exit_code, 2) << command << ": " << outcome.stderr_text;
    EXPECT_THAT(outcome.stderr_text,
                HasSubstr("data.shards: shard pattern '/d/s-{0..3.tar': unmatched brace"))
        << command;
  }
  const Outcome val = RunDtrain(absl::StrCat("recipe check ", DTRAIN_SOURCE_DIR,
                                             "/configs/tiny.yaml --set data.format=webdataset "
                                             "--set data.shards=/d/s.tar --set "
                                             "data.val_shards=/d/v-{a}.tar"));
  EXPECT_EQ(val.exit_code, 2);
  EXPECT_THAT(val.stderr_text, HasSubstr("data.val_shards: shard pattern '/d/v-{a}.tar'"));
}

// A path starting with '~' is a usage error from `recipe check` and `train` (a run made a folder
// named '~').
TEST(CliTest, APathStartingWithATildeExits2) {
  for (const char* command : {"recipe check", "train"}) {
    const Outcome outcome = RunDtrain(absl::StrCat(
        command, " ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set run.out_dir=~/dtrain-runs"));
    EXPECT_EQ(outcome.exit_code, 2) << command << ": " << outcome.stderr_text;
    EXPECT_THAT(outcome.stderr_text, HasSubstr("run.out_dir: '~/dtrain-runs' starts with '~'"))
        << command;
  }
}

// Usage errors of the command line name the fix: the nearest command or option, the command
// whose option it is, the commands a command needs one of.
TEST(CliTest, MistypedCommandsAndOptionsGetTheNearestName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trian", "dtrain has no command 'trian' (did you mean train?); dtrain help lists them"},
      {"data pak x", "dtrain data has no command 'pak' (did you mean pack?)"},
      {"launch --nprocs-per-node 2 x.yaml",
       "dtrain launch has no option --nprocs-per-node (did you mean --nproc-per-node?)"},
      {"train --nproc-per-node 2 x.yaml",
       "dtrain train has no option --nproc-per-node (dtrain env and dtrain launch have it)"},
      {"ckpt export a --out b --formt=hf",
       "dtrain ckpt export has no option --formt (did you mean --format?)"},
      {"recipe", "dtrain recipe needs a command: check, reference"},
  };
  for (const auto& [command, message] : cases) {
    const Outcome outcome = RunDtrain(command);
    EXPECT_EQ(outcome.exit_code, 2) << command;
    EXPECT_THAT(outcome.stderr_text, HasSubstr("error: " + message)) << command;
  }
  // Other parse errors keep CLI11's words, after dtrain's "error: ".
  EXPECT_THAT(RunDtrain("plan --top 5000 x.yaml").stderr_text,
              ::testing::StartsWith("error: --top: Value 5000 not in range"));
  EXPECT_THAT(RunDtrain("train a b").stderr_text,
              ::testing::StartsWith("error: The following argument was not expected: b"));
}

// One rank has no collective to measure: a usage error, not a table of copy speeds.
TEST(CliTest, BenchCommOnOneRankIsAUsageError) {
  const Outcome outcome = RunDtrain("bench comm");
  EXPECT_EQ(outcome.exit_code, 2) << outcome.stdout_text;
  EXPECT_THAT(outcome.stderr_text, HasSubstr("this world has one"));
  EXPECT_EQ(outcome.stdout_text, "");
}

// Sizes that cannot run are refused before the rendezvous, exit 2: a largest size beyond memory
// aborted every rank (std::bad_alloc), sizes in the wrong order failed after it with exit 1. No
// rank 1 is started: the refusal must not wait for it.
TEST(CliTest, BenchCommSizesThatCannotRunAreUsageErrors) {
  const std::string world = "env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 ";
  const Outcome huge = RunDtrain("bench comm --min-bytes 1K --max-bytes 100T", world);
  EXPECT_EQ(huge.exit_code, 2) << huge.stderr_text;
  EXPECT_THAT(huge.stderr_text, HasSubstr("GiB of this machine's memory: lower --max-bytes"));
  const Outcome reversed = RunDtrain("bench comm --min-bytes 64M --max-bytes 1K", world);
  EXPECT_EQ(reversed.exit_code, 2) << reversed.stderr_text;
  EXPECT_THAT(reversed.stderr_text, HasSubstr("need 0 < --min-bytes <= --max-bytes"));
}

// Data that is not on this machine is a warning from `recipe check` (the nodes that train may
// see other files), which still prints the recipe.
TEST(CliTest, RecipeCheckWarnsOfLocalDataThatIsNotHere) {
  const std::string tiny = absl::StrCat("recipe check ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml");
  const Outcome shards = RunDtrain(
      absl::StrCat(tiny,
                   " --set data.format=webdataset --set data.shards=/d/s-{0..1}.tar --set "
                   "data.val_shards=/d/v.tar"));
  EXPECT_EQ(shards.exit_code, 0) << shards.stderr_text;
  EXPECT_THAT(shards.stderr_text, HasSubstr("data.shards: shard /d/s-0.tar does not exist"));
  EXPECT_THAT(shards.stdout_text, HasSubstr("shards: \"/d/s-{0..1}.tar\""));
  const Outcome text = RunDtrain(absl::StrCat(tiny, " --set data.train=[/d/missing.txt]"));
  EXPECT_EQ(text.exit_code, 0) << text.stderr_text;
  EXPECT_THAT(text.stderr_text,
              AllOf(HasSubstr("data.train: "), HasSubstr("/d/missing.txt"),
                    HasSubstr("(here; the nodes that train may see other files)")));
}

// parallel.sequence_parallel with a tp that does not divide train.seq_len: exit 2 naming the
// keys and the nearest values, from `recipe check` and from `train` before any rank starts.
TEST(CliTest, SequenceParallelSeqLenNotDivisibleByTpExits2) {
  const std::string sets =
      " --set parallel.tp=4 --set parallel.sequence_parallel=true --set train.seq_len=126";
  for (const std::string& command :
       {"recipe check " + std::string(DTRAIN_SOURCE_DIR) + "/configs/tiny.yaml" + sets,
        "train" + sets}) {
    SCOPED_TRACE(command);
    const Outcome outcome = RunDtrain(command);
    EXPECT_EQ(outcome.exit_code, 2);
    EXPECT_THAT(outcome.stderr_text,
                AllOf(HasSubstr("parallel.sequence_parallel"),
                      HasSubstr("train.seq_len: 124 or 128"), HasSubstr("parallel.tp: 2")));
    EXPECT_THAT(outcome.stderr_text, Not(HasSubstr("step ")));
  }
}

// The cluster section's catalog names are checked by `recipe check` and `train` as by `plan`.
TEST(CliTest, AnUnknownClusterNameExits2) {
  for (const std::string& command :
       {"recipe check " + std::string(DTRAIN_SOURCE_DIR) + "/configs/tiny.yaml",
        std::string("train")}) {
    SCOPED_TRACE(command);
    const Outcome gpu = RunDtrain(command + " --set cluster.gpu=h100-sxmm");
    EXPECT_EQ(gpu.exit_code, 2);
    EXPECT_THAT(gpu.stderr_text, HasSubstr("cluster.gpu: 'h100-sxmm' is not in the catalog"));
    const Outcome network = RunDtrain(command + " --set cluster.network=infiniband");
    EXPECT_EQ(network.exit_code, 2);
    EXPECT_THAT(network.stderr_text, HasSubstr("cluster.network: 'infiniband' is not a network"));
  }
}

TEST(CliTest, TrainWithBadRecipeExits2BeforeRunning) {
  const Outcome outcome = RunDtrain("train --set parallel.tp=3");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("parallel.tp"));
  const Outcome missing = RunDtrain("train /nonexistent/recipe.yaml");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.stderr_text, HasSubstr("/nonexistent/recipe.yaml"));
}

// Bad input ends in exit 2 and a message, never in an abort (exit 134).
// The issue's bad pipeline inputs: exit 2 naming the keys and the nearest valid values.
TEST(CliTest, TrainWithABadPipelineExits2NamingTheKeys) {
  const Outcome too_deep = RunDtrain("train --set parallel.pp=64");
  EXPECT_EQ(too_deep.exit_code, 2);
  EXPECT_THAT(too_deep.stderr_text,
              HasSubstr("--set parallel.pp=64: 64 stages exceed the model.n_layer = "));
  const Outcome chunks = RunDtrain(
      "train --set parallel.pp=2 --set parallel.pp_schedule=interleaved "
      "--set parallel.pp_virtual_stages=3");
  EXPECT_EQ(chunks.exit_code, 2);
  EXPECT_THAT(chunks.stderr_text, HasSubstr("parallel.pp_virtual_stages=3: 3 does not divide"));
  EXPECT_THAT(chunks.stderr_text, HasSubstr("nearest values that fit: parallel.pp_virtual_stages"));
}

TEST(CliTest, RecipeCheckRefusesTextThatIsNotUtf8) {
  const std::string path = testing::WriteTempFile("latin1.yaml",
                                                  "run:\n  name: \"sm\xff"
                                                  "all\"\ndata:\n  train: [x]\n");
  const Outcome outcome = RunDtrain(absl::StrCat("recipe check ", path));
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("run.name at " + path + ":2:9: byte 3 (0xff)"));
  const Outcome train = RunDtrain(absl::StrCat("train ", path));
  EXPECT_EQ(train.exit_code, 2);
  EXPECT_THAT(train.stderr_text, HasSubstr("not valid UTF-8"));
}

TEST(CliTest, RecipeCheckOfADirectorySaysSo) {
  const std::string dir = ::testing::TempDir();
  const Outcome outcome = RunDtrain(absl::StrCat("recipe check ", dir));
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("the recipe path '" + dir + "' is a directory"));
}

TEST(CliTest, RecipeCheckRefusesAbsurdModelSizes) {
  const std::string path = testing::WriteTempFile("absurd.yaml", "data:\n  train: [x]\n");
  const Outcome layers =
      RunDtrain(absl::StrCat("recipe check ", path, " --set model.n_layer=2000000000"));
  EXPECT_EQ(layers.exit_code, 2);
  EXPECT_THAT(layers.stderr_text,
              HasSubstr("--set model.n_layer=2000000000: must be in [1, 65536]"));
  const Outcome product = RunDtrain(
      absl::StrCat("recipe check ", path, " --set model.n_layer=65536 --set model.d_model=65536"));
  EXPECT_EQ(product.exit_code, 2);
  EXPECT_THAT(product.stderr_text, HasSubstr("above dtrain's bound of 1e+13 parameters"));
  const Outcome train = RunDtrain(
      absl::StrCat("train ", path, " --set model.n_layer=65536 --set model.d_model=65536"));
  EXPECT_EQ(train.exit_code, 2);
  EXPECT_THAT(train.stderr_text, HasSubstr("above dtrain's bound of 1e+13 parameters"));
}

TEST(CliTest, RecipeCheckRefusesAnUnclosedQuote) {
  const std::string path = testing::WriteTempFile(
      "quote.yaml", "data:\n  train: [x]\nrun:\n  name: \"tiny\nmodel:\n  n_layer: 3\n");
  const Outcome outcome = RunDtrain(absl::StrCat("recipe check ", path));
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("close the quote on line 4"));
}

TEST(CliTest, RecipeReferencePrintsTable) {
  const Outcome outcome = RunDtrain("recipe reference");
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_THAT(outcome.stdout_text, HasSubstr("| `train.lr` |"));
}

// Output that cannot be written fails the command, which exited 0 into /dev/full; a reader that
// stops early (`| head -1`) is no failure, SIGPIPE ignored or not.
TEST(CliTest, OutputThatCannotBeWrittenFailsTheCommand) {
  for (const std::string& args :
       {std::string("recipe reference"),
        absl::StrCat("recipe check ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml")}) {
    const Outcome full = RunDtrain(args + " >/dev/full");
    EXPECT_EQ(full.exit_code, 1) << args;
    EXPECT_THAT(full.stderr_text,
                HasSubstr("error: cannot write to standard output: No space left on device"))
        << args;
  }
  const Outcome closed = RunDtrain(
      "recipe reference", R"(bash -c 'trap "" PIPE; "$0" "$@" | true; exit ${PIPESTATUS[0]}')");
  EXPECT_EQ(closed.exit_code, 0) << closed.stderr_text;
  EXPECT_EQ(closed.stderr_text, "");
}

// A number out of an option's range names the bound as a person writes it (CLI11's own checks
// print it as a 309-digit double).
TEST(CliTest, AnOptionOutOfRangeStatesItsBound) {
  const Outcome negative = RunDtrain("launch --max-restarts -1");
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_THAT(negative.stderr_text, HasSubstr("--max-restarts: expected a number >= 0, got -1"));
  const Outcome zero = RunDtrain("launch --rdzv-timeout-s 0");
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_THAT(zero.stderr_text, HasSubstr("--rdzv-timeout-s: expected a number > 0, got 0"));
  EXPECT_LT(zero.stderr_text.size(), 200u) << zero.stderr_text;
}

TEST(CliTest, VersionAndHelp) {
  const Outcome version = RunDtrain("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.stdout_text, absl::StrCat("dtrain ", DTRAIN_VERSION, "\n"));
  for (const char* args : {"--version extra", "--version train"}) {
    const Outcome extra = RunDtrain(args);
    EXPECT_EQ(extra.exit_code, 2) << args;
    EXPECT_EQ(extra.stdout_text, "") << args;
    EXPECT_EQ(extra.stderr_text,
              "error: --version takes nothing else; run dtrain --version alone\n")
        << args;
  }

  for (const char* args : {"help", "--help"}) {
    const Outcome help = RunDtrain(args);
    EXPECT_EQ(help.exit_code, 0) << args;
    EXPECT_THAT(help.stdout_text, HasSubstr("train")) << args;
    EXPECT_THAT(help.stdout_text, HasSubstr("recipe")) << args;
  }
  const Outcome none = RunDtrain("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.stderr_text, HasSubstr("train"));
  EXPECT_EQ(RunDtrain("no-such-command").exit_code, 2);
}

}  // namespace
}  // namespace dtrain
