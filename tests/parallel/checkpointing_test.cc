// Resume through `dtrain train` in one process: damaged checkpoints are skipped and named, the
// previous one is used, nothing is overwritten, and recipe changes are judged.
#include "parallel/checkpointing.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/reader.h"
#include "core/checkpoint/tools.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/folder_lock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_v1.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string RecipeFile() {
  std::string text;
  for (int i = 0; i < 300; ++i) absl::StrAppend(&text, "Sphinx of black quartz ", i % 11, ".\n");
  const std::string data = testing::WriteTempFile("ckpt_text.txt", text);
  return testing::WriteTempFile("ckpt_recipe.yaml", absl::StrCat(R"(
run: {name: ck, seed: 3, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [)",
                                                                 data, R"(]}
train: {steps: 8, batch_size: 8, micro_batch: 4, seq_len: 16, warmup_steps: 1, eval_every: 0,
        export_to: ""}
checkpoint: {interval: 2, keep_last: 4}
)"));
}

std::vector<double> Losses(const std::string& out_dir) {
  return testing::MetricsLosses(out_dir + "/ck/metrics.jsonl");
}

testing::Outcome Train(const std::string& out_dir, const std::string& extra = "") {
  return testing::RunDtrain(
      absl::StrCat("train ", RecipeFile(), " --set run.out_dir=", out_dir, " ", extra));
}

// An 8-step run with checkpoints at 2, 4, 6, 8; then step-8 removed and step-6 damaged by
// `damage`: the rerun must skip step-6, resume from step-4 and redo steps 5..8 identically.
void ExpectFallbackToStep4(const std::string& name,
                           const std::function<void(const std::string& step6)>& damage,
                           const std::string& expected_reason) {
  const std::string out = testing::TempPath(name);
  fs::remove_all(out);
  const testing::Outcome first = Train(out);
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  const std::vector<double> reference = Losses(out);
  ASSERT_EQ(reference.size(), 8u);
  const std::string dir = out + "/ck/checkpoints";
  fs::remove_all(dir + "/step-8");
  damage(dir + "/step-6");
  std::ofstream(dir + "/latest") << "step-8\n";  // stale: names a folder that is gone

  const testing::Outcome second = Train(out);
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_THAT(second.stderr_text, HasSubstr("skipping checkpoint " + dir + "/step-6"));
  EXPECT_THAT(second.stderr_text, HasSubstr(expected_reason));
  EXPECT_THAT(second.stderr_text, HasSubstr("resumed from " + dir + "/step-4 at step 4"));
  EXPECT_THAT(second.stderr_text, HasSubstr("latest names step-8"));
  EXPECT_EQ(Losses(out), reference);  // metrics.jsonl keeps steps 1-4, then 5-8 again
  // An auto resume redoes the steps whose lines it drops: the file is not kept aside.
  EXPECT_THAT(second.stderr_text, ::testing::Not(HasSubstr("are left out")));
  // The damaged checkpoint was moved aside, not overwritten; a new step-6 is complete.
  bool aside = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    aside |= entry.path().filename().string().rfind("step-6.replaced-", 0) == 0;
  }
  EXPECT_TRUE(aside);
  EXPECT_TRUE(fs::exists(dir + "/step-6/manifest.json"));
  EXPECT_EQ(testing::RunDtrain("ckpt inspect " + dir + "/step-8").exit_code, 0);
}

TEST(CheckpointingTest, AFlippedByteIsSkippedAndThePreviousOneUsed) {
  ExpectFallbackToStep4(
      "ckpt_flip_run",
      [](const std::string& step6) {
        std::fstream file(step6 + "/rank-0.bin", std::ios::in | std::ios::out | std::ios::binary);
        file.seekp(100);
        file.put('\x7f');
      },
      "checksum");
}

TEST(CheckpointingTest, ATruncatedRankFileIsSkipped) {
  ExpectFallbackToStep4(
      "ckpt_trunc_run",
      [](const std::string& step6) { fs::resize_file(step6 + "/rank-0.bin", 1000); },
      "rank-0.bin holds 1000 bytes");
}

TEST(CheckpointingTest, AMissingManifestIsSkipped) {
  ExpectFallbackToStep4(
      "ckpt_nomanifest_run", [](const std::string& step6) { fs::remove(step6 + "/manifest.json"); },
      "did not complete");
}

// A resumed run keeps the metrics lines of its steps and drops any other line (edited, or cut
// off by a crash); one whose "step" is no number aborted it.
TEST(CheckpointingTest, AResumeDropsMetricsLinesThatAreNoSteps) {
  const std::string out = testing::TempPath("ckpt_metrics_junk_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=4").exit_code, 0);
  const std::vector<double> before = Losses(out);
  std::ofstream(out + "/ck/metrics.jsonl", std::ios::app)
      << "{\"step\": \"oops\"}\nnot json\n[1, 2]\n{\"step\": 3, \"loss\": 1.";
  const testing::Outcome resumed = Train(out, "--set train.steps=6");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  const std::vector<double> after = Losses(out);
  ASSERT_EQ(after.size(), 6u);
  EXPECT_EQ(std::vector<double>(after.begin(), after.begin() + 4), before);
}

// A checkpoint folder none of whose checkpoints loads is an error that changes nothing: a fresh
// start would lose the run's history and prune the checkpoints, as it once did. Checkpoints that
// are all damaged (truncated here) exit 2, which an agent does not restart to find them damaged
// again.
TEST(CheckpointingTest, WhenNoCheckpointLoadsTheRunStopsAndChangesNothing) {
  const std::string out = testing::TempPath("ckpt_none_loads_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=4").exit_code, 0);
  const std::string dir = out + "/ck/checkpoints";
  for (const std::string step : {"step-2", "step-4"}) {
    fs::resize_file(dir + "/" + step + "/rank-0.bin", 1000);
  }
  const std::vector<double> before = Losses(out);
  ASSERT_EQ(before.size(), 4u);
  const std::string recipe = *ReadWholeFile(out + "/ck/recipe.yaml");

  const testing::Outcome second = Train(out, "--set train.steps=8");
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_EQ(*ReadWholeFile(out + "/ck/recipe.yaml"), recipe);
  EXPECT_THAT(second.stderr_text, HasSubstr("skipping checkpoint " + dir + "/step-4"));
  EXPECT_THAT(
      second.stderr_text,
      HasSubstr("checkpoint.resume: auto: none of the 2 checkpoint(s) in " + dir + " loads"));
  EXPECT_THAT(second.stderr_text, HasSubstr("checkpoint.resume: never"));
  EXPECT_EQ(Losses(out), before);
  for (const std::string step : {"step-2", "step-4"}) {
    EXPECT_EQ(fs::file_size(dir + "/" + step + "/rank-0.bin"), 1000u) << step;
  }
  EXPECT_FALSE(fs::exists(dir + "/step-6"));
  EXPECT_FALSE(fs::exists(dir + "/step-8"));
}

// A checkpoint that cannot be read (here a rank file the run, as user nobody, may not read) stops
// the run, changing nothing: an older checkpoint in its place would drop its steps and set it
// aside. Permissions exit 2, which an agent's restart would meet again.
TEST(CheckpointingTest, ACheckpointThatCannotBeReadIsNotReplacedByAnOlderOne) {
  const std::string out = testing::TempPath("ckpt_unreadable_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=4").exit_code, 0);
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    fs::permissions(entry.path(), fs::perms::all, fs::perm_options::add);
  }
  fs::permissions(out, fs::perms::all, fs::perm_options::add);
  const std::string dir = out + "/ck/checkpoints";
  fs::permissions(dir + "/step-4/rank-0.bin", fs::perms::none);
  const std::vector<double> before = Losses(out);

  const testing::Outcome second = testing::RunDtrain(
      absl::StrCat("train ", RecipeFile(), " --set run.out_dir=", out, " --set train.steps=8"),
      "setpriv --reuid=65534 --regid=65534 --clear-groups");
  EXPECT_EQ(second.exit_code, 2) << second.stderr_text;
  EXPECT_THAT(second.stderr_text,
              AllOf(HasSubstr("cannot read checkpoint " + dir + "/step-4: "),
                    HasSubstr("Permission denied"),
                    HasSubstr(dir + "/step-4 could not be read (see the warnings); nothing was "
                                    "changed and no older checkpoint was taken in its place. Give "
                                    "the run read access to it")));
  EXPECT_THAT(second.stderr_text, ::testing::Not(HasSubstr("resumed from")));
  EXPECT_EQ(Losses(out), before);
  EXPECT_TRUE(fs::exists(dir + "/step-4/manifest.json"));
  EXPECT_FALSE(fs::exists(dir + "/step-6"));
}

// A checkpoint.resume path that does not exist is a usage error before anything is written; a
// relative one says where it was looked for, which is not the run folder that checkpoint.dir is
// relative to.
TEST(CheckpointingTest, AResumePathThatDoesNotExistSaysWhereItWasLookedFor) {
  const std::string out = testing::TempPath("ckpt_resume_missing_run");
  fs::remove_all(out);
  const testing::Outcome missing = Train(out, "--set checkpoint.resume=checkpoints/step-2");
  EXPECT_EQ(missing.exit_code, 2) << missing.stderr_text;
  EXPECT_THAT(missing.stderr_text,
              HasSubstr("checkpoint.resume: checkpoints/step-2 does not exist (a relative path is "
                        "from the folder dtrain runs in, " +
                        fs::current_path().string() + ", not from the run folder"));
  EXPECT_FALSE(fs::exists(out)) << "a run refused at start wrote its folder";
}

// An explicit step-<N> folder that loads says nothing of the folder's `latest`, which names a
// newer checkpoint that is fine.
TEST(CheckpointingTest, AnOlderCheckpointGivenByPathLeavesLatestAlone) {
  const std::string out = testing::TempPath("ckpt_older_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=4").exit_code, 0);
  const std::string dir = out + "/ck/checkpoints";
  const testing::Outcome second =
      Train(out, "--set train.steps=4 --set checkpoint.resume=" + dir + "/step-2");
  EXPECT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_THAT(second.stderr_text, HasSubstr("resumed from " + dir + "/step-2 at step 2"));
  EXPECT_THAT(second.stderr_text, ::testing::Not(HasSubstr("stale")));
  // Resuming a checkpoint it names, the run keeps the file of steps 3-4 it left out beside it.
  EXPECT_THAT(second.stderr_text, HasSubstr("the lines of 2 step(s) past step 2, where this run "
                                            "starts, are left out; the file as it was is kept"));
}

// A run that starts over (checkpoint.resume: never) moves the earlier run's checkpoints aside,
// kept for inspection: the next auto resume continues the new run, not the abandoned one, and
// its metrics are the new run's alone.
TEST(CheckpointingTest, StartingOverSetsTheEarlierRunsCheckpointsAside) {
  const std::string out = testing::TempPath("ckpt_start_over_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out).exit_code, 0);  // checkpoints at 2, 4, 6, 8
  const std::string dir = out + "/ck/checkpoints";
  const testing::Outcome fresh = Train(out, "--set train.steps=2 --set checkpoint.resume=never");
  ASSERT_EQ(fresh.exit_code, 0) << fresh.stderr_text;
  EXPECT_THAT(fresh.stderr_text, HasSubstr("checkpoint: " + dir +
                                           "/step-8 is past step 0, where this run starts: "
                                           "moved to " +
                                           dir + "/step-8.replaced-"));
  // They are kept, never pruned: the run says how many and how large they are.
  EXPECT_THAT(fresh.stderr_text,
              ::testing::ContainsRegex("checkpoint: .*/checkpoints holds 4 set-aside checkpoint "
                                       "folder\\(s\\), [0-9.]+ MiB in all, kept for inspection"));
  std::vector<std::string> names;  // but the run's lock, .lock
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename() != ".lock") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 6u) << ::testing::PrintToString(names);
  EXPECT_EQ(names[0], "latest");
  EXPECT_EQ(names[1], "step-2");
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_THAT(names[2 + i],
                ::testing::StartsWith(absl::StrCat("step-", 2 * (i + 1), ".replaced-")));
  }
  // So are the earlier run's metrics, the only record of its 8 steps.
  const std::string metrics = out + "/ck/metrics.jsonl";
  EXPECT_THAT(fresh.stderr_text,
              HasSubstr(metrics +
                        ": the lines of 8 step(s) past step 0, where this run starts, "
                        "are left out; the file as it was is kept as " +
                        metrics + ".replaced-"));
  std::vector<std::string> asides;
  for (const auto& entry : fs::directory_iterator(out + "/ck")) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "metrics.jsonl.replaced-")) asides.push_back(entry.path());
  }
  ASSERT_EQ(asides.size(), 1u);
  EXPECT_EQ(testing::MetricsLosses(asides[0]).size(), 8u);
  const std::vector<double> fresh_losses = Losses(out);
  const testing::Outcome resumed = Train(out, "--set train.steps=3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_THAT(resumed.stderr_text, HasSubstr("resumed from " + dir + "/step-2 at step 2"));
  const std::vector<double> losses = Losses(out);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_EQ(std::vector<double>(losses.begin(), losses.begin() + 2), fresh_losses);
}

TEST(CheckpointingTest, AVersion1CheckpointResumesIdentically) {
  const std::string out = testing::TempPath("ckpt_v1_run");
  fs::remove_all(out);
  const testing::Outcome first = Train(out);
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  const std::vector<double> reference = Losses(out);
  const std::string dir = out + "/ck/checkpoints";
  fs::remove_all(dir + "/step-6");
  fs::remove_all(dir + "/step-8");
  testing::RewriteAsVersion1(dir + "/step-4");
  EXPECT_THAT(testing::RunDtrain("ckpt inspect " + dir + "/step-4").stdout_text,
              HasSubstr("format 1"));

  const testing::Outcome second = Train(out);
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_THAT(second.stderr_text, HasSubstr("resumed from " + dir + "/step-4 at step 4"));
  EXPECT_EQ(Losses(out), reference);
}

TEST(CheckpointingTest, InspectNamesTheBadChunkAndFails) {
  const std::string out = testing::TempPath("ckpt_inspect_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=2").exit_code, 0);
  const std::string step = out + "/ck/checkpoints/step-2";
  const testing::Outcome good = testing::RunDtrain("ckpt inspect " + step);
  EXPECT_EQ(good.exit_code, 0) << good.stderr_text;
  EXPECT_THAT(good.stdout_text, HasSubstr("step 2 (AdamW step 2"));
  EXPECT_THAT(good.stdout_text, HasSubstr("chunks valid"));
  {
    std::fstream file(step + "/rank-0.bin", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8);
    file.put('\x01');
  }
  const testing::Outcome bad = testing::RunDtrain("ckpt inspect " + step);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.stdout_text, HasSubstr("in rank-0.bin at byte 0"));
}

// A path that holds no checkpoint is the command line's error (exit 2), not a damaged checkpoint
// (1); a `latest` that names a checkpoint no longer there is called stale.
TEST(CheckpointingTest, InspectOfAWrongPathIsAUsageErrorAndAStaleLatestIsNamed) {
  const std::string out = testing::TempPath("ckpt_inspect_paths");
  fs::remove_all(out);
  const testing::Outcome missing = testing::RunDtrain("ckpt inspect " + out + "/nowhere");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.stderr_text, HasSubstr("/nowhere is no checkpoint: give a step-<N> folder"));
  ASSERT_EQ(Train(out, "--set train.steps=2").exit_code, 0);
  const std::string folder = out + "/ck/checkpoints";
  std::ofstream(folder + "/latest") << "step-20\n";
  const testing::Outcome stale = testing::RunDtrain("ckpt inspect " + folder);
  EXPECT_EQ(stale.exit_code, 0) << stale.stdout_text;
  EXPECT_THAT(stale.stdout_text,
              HasSubstr("latest names step-20, which is not here: latest is stale"));
  const testing::Outcome empty = testing::RunDtrain("ckpt inspect " + out + "/ck");
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.stdout_text, HasSubstr("holds no step-<N> checkpoint folders"));
  // A file of a checkpoint (its manifest) says to give its folder.
  const std::string manifest = folder + "/step-2/manifest.json";
  const testing::Outcome file = testing::RunDtrain("ckpt inspect " + manifest);
  EXPECT_EQ(file.exit_code, 2);
  EXPECT_THAT(file.stdout_text, HasSubstr(manifest + " is a file: give its step-<N> folder"));
}

// `dtrain ckpt bench DIR` writes in a scratch folder of its own inside DIR and removes it: a run
// folder given by mistake keeps its checkpoints, metrics and recipe.
TEST(CheckpointingTest, BenchLeavesTheFolderItIsGivenAlone) {
  const std::string out = testing::TempPath("ckpt_bench_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=2").exit_code, 0);
  const auto listing = [&] {
    std::vector<std::string> paths;
    for (const auto& entry : fs::recursive_directory_iterator(out)) {
      paths.push_back(entry.path().string());
    }
    std::sort(paths.begin(), paths.end());
    return paths;
  };
  const std::vector<std::string> before = listing();
  const testing::Outcome bench = testing::RunDtrain("ckpt bench " + out + " --values 1000");
  ASSERT_EQ(bench.exit_code, 0) << bench.stderr_text;
  EXPECT_THAT(bench.stdout_text, HasSubstr("bytes=12000 save_s="));
  EXPECT_EQ(listing(), before);
  EXPECT_TRUE(fs::exists(out + "/ck/checkpoints/step-2/manifest.json"));
}

// A count that is no count, or whose state cannot fit the machine, is refused before anything is
// written (exit 2): -1 aborted in std::length_error and left its scratch folder behind.
TEST(CheckpointingTest, BenchRefusesCountsThatCannotRun) {
  const std::string out = testing::TempPath("ckpt_bench_counts");
  fs::remove_all(out);
  const testing::Outcome negative = testing::RunDtrain("ckpt bench " + out + " --values -1");
  EXPECT_EQ(negative.exit_code, 2) << negative.stderr_text;
  EXPECT_THAT(negative.stderr_text, HasSubstr("--values: expected a number > 0, got -1"));
  const testing::Outcome huge =
      testing::RunDtrain("ckpt bench " + out + " --values 9223372036854775807");
  EXPECT_EQ(huge.exit_code, 2) << huge.stderr_text;
  EXPECT_THAT(huge.stderr_text, HasSubstr("the bench holds 6 floats a value"));
  EXPECT_FALSE(fs::exists(out));
}

TEST(CheckpointingTest, ExportWritesHuggingFaceAndLlmcFiles) {
  const std::string out = testing::TempPath("ckpt_export_run");
  fs::remove_all(out);
  // With a key that only warns: the export reads the run's recipe without warning again.
  ASSERT_EQ(Train(out,
                  "--set train.steps=2 --set train.export_to=model.safetensors --set "
                  "parallel.sequence_parallel=true")
                .exit_code,
            0);
  const std::string exported = out + "/from_ckpt.safetensors";
  const testing::Outcome result =
      testing::RunDtrain(absl::StrCat("ckpt export ", out, "/ck/checkpoints --out ", exported));
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_THAT(result.stderr_text, ::testing::Not(HasSubstr("has no effect")));
  EXPECT_THAT(result.stdout_text,
              HasSubstr("(safetensors) from " + out + "/ck/checkpoints/step-2"));
  // Every tensor of the trainer's own export, bit for bit (the header's metadata differs).
  const SafetensorsContents trained = testing::ReadWeights(out + "/ck/model.safetensors");
  testing::ExpectWeightsNear(testing::ReadWeights(exported), trained, 0);
  // A newer checkpoint that did not complete is skipped, saying so, and the export says which
  // one it took.
  fs::create_directories(out + "/ck/checkpoints/step-3");
  const testing::Outcome older = testing::RunDtrain(
      absl::StrCat("ckpt export ", out, "/ck/checkpoints --out ", out, "/older.safetensors"));
  ASSERT_EQ(older.exit_code, 0) << older.stderr_text;
  EXPECT_THAT(older.stderr_text,
              HasSubstr("skipping checkpoint " + out + "/ck/checkpoints/step-3: " + out +
                        "/ck/checkpoints/step-3 has no manifest.json"));
  EXPECT_THAT(older.stdout_text, HasSubstr("from " + out + "/ck/checkpoints/step-2"));
  fs::remove_all(out + "/ck/checkpoints/step-3");

  const std::string llmc = out + "/model.bin";
  const testing::Outcome l = testing::RunDtrain(
      absl::StrCat("ckpt export ", out, "/ck/checkpoints/step-2 --format llmc --out ", llmc));
  ASSERT_EQ(l.exit_code, 0) << l.stderr_text;
  // A format it does not write is the command line's error.
  const testing::Outcome gguf = testing::RunDtrain(
      absl::StrCat("ckpt export ", out, "/ck/checkpoints --format gguf --out ", out, "/m.gguf"));
  EXPECT_EQ(gguf.exit_code, 2);
  EXPECT_THAT(gguf.stderr_text,
              HasSubstr("--format gguf is not known; use safetensors, hf or llmc"));
  // An export into the checkpoint it reads (a rank file's path, the step folder for hf, the
  // checkpoint folder, its `latest`) is refused, and the checkpoint still loads.
  const std::string step = out + "/ck/checkpoints/step-2";
  for (const std::string& into :
       {step + "/rank-0.bin", step, out + "/ck/checkpoints", out + "/ck/checkpoints/latest"}) {
    const testing::Outcome refused = testing::RunDtrain(
        absl::StrCat("ckpt export ", out, "/ck/checkpoints --format hf --out ", into));
    EXPECT_EQ(refused.exit_code, 2) << into << ": " << refused.stderr_text;
    EXPECT_THAT(refused.stderr_text, HasSubstr("the export would overwrite it")) << into;
  }
  EXPECT_EQ(testing::RunDtrain(absl::StrCat("ckpt inspect ", step)).exit_code, 0);
  // A FIFO, a device or a folder at --out stays what it is; a link stays a link to the export.
  const std::string fifo = out + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string format : {"safetensors", "llmc"}) {
    const testing::Outcome refused = testing::RunDtrain(
        absl::StrCat("ckpt export ", out, "/ck/checkpoints --format ", format, " --out ", fifo));
    EXPECT_EQ(refused.exit_code, 2) << refused.stderr_text;
    EXPECT_THAT(refused.stderr_text, HasSubstr(fifo + " is a FIFO, not a regular file"));
    EXPECT_TRUE(fs::is_fifo(fifo));
  }
  // A file of something else (a recipe mistyped as --out) is refused and kept, as the
  // safetensors export refuses it; an earlier export (through the link below) is written over.
  const std::string recipe = out + "/recipe.yaml";
  std::ofstream(recipe) << "run: {name: kept}\n";
  const testing::Outcome over_recipe = testing::RunDtrain(
      absl::StrCat("ckpt export ", out, "/ck/checkpoints --format llmc --out ", recipe));
  EXPECT_EQ(over_recipe.exit_code, 2) << over_recipe.stderr_text;
  EXPECT_THAT(over_recipe.stderr_text,
              HasSubstr(recipe + " exists and is no llm.c model file, which the export would "
                                 "write over"));
  EXPECT_EQ(fs::file_size(recipe), 18u);
  fs::create_symlink("model.bin", out + "/model-link.bin");
  ASSERT_EQ(
      testing::RunDtrain(absl::StrCat("ckpt export ", out, "/ck/checkpoints --format llmc --out ",
                                      out, "/model-link.bin"))
          .exit_code,
      0);
  EXPECT_TRUE(fs::is_symlink(out + "/model-link.bin"));
  std::ifstream in(llmc, std::ios::binary);
  int32_t header[8];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240326);
  EXPECT_EQ(header[1], 3);
  EXPECT_EQ(header[7], 256);  // vocabulary 256 padded to a multiple of 128
  // After the 256-int header, llm.c's first tensor: the token embedding, V x C.
  const std::vector<float>& wte = trained.floats.at("wte.weight");
  std::vector<float> read(wte.size());
  in.seekg(256 * sizeof(int32_t));
  in.read(reinterpret_cast<char*>(read.data()), static_cast<std::streamsize>(read.size() * 4));
  EXPECT_EQ(read, wte);
}

// A run still training prunes its older checkpoints as it saves (checkpoint.keep_last): an export
// whose checkpoint was removed while it read it takes the newest again; a step folder given by
// name is not taken again, nor is a failure of a folder that is still there.
TEST(CheckpointingTest, ACheckpointPrunedWhileItIsReadIsTakenAgainFromTheNewest) {
  const std::string out = testing::TempPath("ckpt_pruned_while_read");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set checkpoint.interval=1 --set checkpoint.keep_last=8").exit_code, 0);
  const std::string dir = out + "/ck/checkpoints";
  // As CheckpointWriter prunes: the folder renamed away at once, then removed.
  const auto prune = [&](const std::string& step) {
    fs::rename(step, dir + "/.pruned");
    fs::remove_all(dir + "/.pruned");
    return absl::NotFoundError(absl::StrCat("open ", step, "/rank-00000.bin: No such file"));
  };
  std::vector<std::string> used;
  ::testing::internal::CaptureStderr();
  const absl::StatusOr<std::string> taken = WithNewestCheckpoint(dir, [&](const std::string& step) {
    used.push_back(step);
    return used.size() == 1 ? prune(step) : absl::OkStatus();
  });
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr(dir + "/step-8 was removed while it was read (a run still training "
                              "pruned it: checkpoint.keep_last); taking the newest again"));
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, dir + "/step-7");
  EXPECT_THAT(used, ElementsAre(dir + "/step-8", dir + "/step-7"));

  const absl::StatusOr<std::string> named = WithNewestCheckpoint(dir + "/step-7", prune);
  EXPECT_TRUE(absl::IsNotFound(named.status())) << named.status();
  EXPECT_THAT(named.status().message(),
              HasSubstr("step-7 was removed while it was read (a run still training pruned it: "
                        "checkpoint.keep_last); give the checkpoint folder, " +
                        dir + ", to take its newest"));
  ASSERT_TRUE(fs::exists(dir + "/step-6"));

  const absl::Status damaged = absl::DataLossError("a chunk's checksum does not match");
  EXPECT_EQ(WithNewestCheckpoint(dir, [&](const std::string&) { return damaged; }).status(),
            damaged);
  EXPECT_TRUE(fs::exists(dir + "/step-6"));

  // Pruned as fast as it is taken: three tries, then the way out.
  ::testing::internal::CaptureStderr();
  const absl::StatusOr<std::string> racing = WithNewestCheckpoint(dir, prune);
  ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(racing.status().message(),
              HasSubstr("as were the 2 taken before it: the run prunes faster than this reads; "
                        "copy a step-<N> folder aside and give it"));
  EXPECT_THAT(CheckpointCandidates(dir),
              ElementsAre(dir + "/step-3", dir + "/step-2", dir + "/step-1"));
  fs::remove_all(out);
}

// An export that finds its file system full exits 3, as training's saves do: a retry would fail
// the same way (it exited 1).
TEST(CheckpointingTest, AnExportToAFullFileSystemExits3) {
  const std::string out = testing::TempPath("ckpt_export_full_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=2").exit_code, 0);
  const std::string small = testing::FreshTempDir("ckpt_export_full");
  const std::string prefix = testing::SmallFileSystemPrefix(small, 16);
  if (prefix.empty()) GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  const testing::Outcome exported = testing::RunDtrain(
      absl::StrCat("ckpt export ", out, "/ck/checkpoints --out ", small, "/m.safetensors"), prefix);
  EXPECT_EQ(exported.exit_code, 3) << exported.stderr_text;
  EXPECT_THAT(exported.stderr_text, HasSubstr("No space left on device"));
}

TEST(CheckpointingTest, AShapeChangeBlocksAndOtherChangesWarn) {
  const std::string out = testing::TempPath("ckpt_recipe_run");
  fs::remove_all(out);
  ASSERT_EQ(Train(out, "--set train.steps=4").exit_code, 0);
  const std::string recipe = *ReadWholeFile(out + "/ck/recipe.yaml");
  // Refused: exit 2 (a restart would refuse it again), the run folder's recipe still the run's.
  const testing::Outcome wider = Train(out, "--set train.steps=6 --set model.d_model=64");
  EXPECT_EQ(wider.exit_code, 2);
  EXPECT_THAT(wider.stderr_text, HasSubstr("model.d_model"));
  EXPECT_THAT(wider.stderr_text, HasSubstr("checkpoint.resume: never"));
  EXPECT_EQ(*ReadWholeFile(out + "/ck/recipe.yaml"), recipe);
  const testing::Outcome longer = Train(out, "--set train.steps=6 --set train.lr=0.002");
  EXPECT_EQ(longer.exit_code, 0) << longer.stderr_text;
  EXPECT_THAT(longer.stderr_text, HasSubstr("saved with other values of train.steps (4, now 6), "
                                            "train.lr (0.001, now 0.002)"));
  EXPECT_THAT(longer.stderr_text, HasSubstr("at step 4"));
  const testing::Outcome fresh = Train(out, "--set train.steps=2 --set checkpoint.resume=never");
  EXPECT_EQ(fresh.exit_code, 0);
  EXPECT_THAT(fresh.stderr_text, ::testing::Not(HasSubstr("resumed")));
}

// A checkpoint.dir outside the run folder that another run saved into resumes with a warning
// naming that run (it resumed silently); a renamed run folder, whose checkpoints stay inside it,
// resumes without one.
TEST(CheckpointingTest, ResumingAnotherRunsCheckpointFolderNamesThatRun) {
  const std::string out = testing::TempPath("ckpt_shared_run");
  fs::remove_all(out);
  const std::string shared = out + "/shared-checkpoints";
  ASSERT_EQ(Train(out, "--set train.steps=4 --set checkpoint.dir=" + shared).exit_code, 0);
  const testing::Outcome other =
      Train(out, "--set train.steps=6 --set run.name=other --set checkpoint.dir=" + shared);
  EXPECT_EQ(other.exit_code, 0) << other.stderr_text;
  EXPECT_THAT(other.stderr_text, HasSubstr("was saved by the run named ck, not other: if "
                                           "checkpoint.dir " +
                                           shared + " is that run's"));

  const std::string moved = testing::TempPath("ckpt_renamed_run");
  fs::remove_all(moved);
  ASSERT_EQ(Train(moved, "--set train.steps=4").exit_code, 0);
  fs::rename(moved + "/ck", moved + "/renamed");
  const testing::Outcome renamed = Train(moved, "--set train.steps=6 --set run.name=renamed");
  EXPECT_EQ(renamed.exit_code, 0) << renamed.stderr_text;
  EXPECT_THAT(renamed.stderr_text, HasSubstr("resumed from"));
  EXPECT_THAT(renamed.stderr_text, ::testing::Not(HasSubstr("was saved by the run named")));
}

// A checkpoint.dir outside the run folder that another run holds is refused before anything in
// it is touched, naming the holder: its stage folder of a save in progress was removed, and its
// later checkpoints set aside.
// Periodic checkpoints follow logging.every in the step log (a checkpoint every 2 steps logged
// 5 times the lines asked for at every 4, over a long run); metrics.jsonl has every step.
TEST(CheckpointingTest, PeriodicCheckpointStepsFollowLoggingEvery) {
  const std::string out = testing::TempPath("ckpt_log_every");
  fs::remove_all(out);
  const testing::Outcome run = Train(out, "--set logging.every=4");
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, AllOf(HasSubstr("step 4/8"), HasSubstr("step 8/8")));
  EXPECT_THAT(run.stderr_text,
              AllOf(::testing::Not(HasSubstr("step 2/8")), ::testing::Not(HasSubstr("step 6/8"))));
  EXPECT_EQ(Losses(out).size(), 8u);
  EXPECT_TRUE(fs::exists(out + "/ck/checkpoints/step-6/manifest.json"));
}

// A checkpoint.dir that is the run folder itself is held by the run's own lock: the run does not
// lock itself out (taking the same lock file twice), and resumes there.
TEST(CheckpointingTest, ACheckpointFolderThatIsTheRunFolderTrainsAndResumes) {
  const std::string out = testing::TempPath("ckpt_in_run_folder");
  fs::remove_all(out);
  const testing::Outcome first = Train(out, "--set train.steps=4 --set checkpoint.dir=.");
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  EXPECT_TRUE(fs::exists(out + "/ck/step-4/manifest.json"));
  const testing::Outcome second = Train(out, "--set train.steps=6 --set checkpoint.dir=.");
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_THAT(second.stderr_text, HasSubstr("/step-4 at step 4"));
}

TEST(CheckpointingTest, ACheckpointFolderInUseIsRefusedNamingItsHolder) {
  const std::string out = testing::TempPath("ckpt_locked_run");
  fs::remove_all(out);
  const std::string shared = out + "/shared-checkpoints";
  const std::string stage = shared + "/.step-20.00000000deadbeef";
  fs::create_directories(stage);
  absl::StatusOr<FolderLock> held =
      FolderLock::AcquireAs(shared, FolderLock::kCheckpointFolder, "pid 4242 on host h");
  ASSERT_TRUE(held.ok()) << held.status();
  const testing::Outcome second =
      Train(out, "--set checkpoint.resume=never --set checkpoint.dir=" + shared);
  EXPECT_EQ(second.exit_code, kExitUsage) << second.stderr_text;  // held until that run ends
  EXPECT_THAT(second.stderr_text,
              HasSubstr("the checkpoint folder " + shared +
                        " is in use by another run (pid 4242 on host h); give this run another "
                        "checkpoint.dir, or end that one"));
  EXPECT_TRUE(fs::exists(stage));

  // A run's default checkpoint folder is held too: another run that named it as its own
  // checkpoint.dir (here the holder) keeps this run out of it.
  const std::string own = out + "/ck/checkpoints";
  absl::StatusOr<FolderLock> named =
      FolderLock::AcquireAs(own, FolderLock::kCheckpointFolder, "pid 4343 on host h");
  ASSERT_TRUE(named.ok()) << named.status();
  const testing::Outcome third = Train(out, "--set checkpoint.resume=never");
  EXPECT_EQ(third.exit_code, kExitUsage) << third.stderr_text;
  EXPECT_THAT(third.stderr_text, HasSubstr("the checkpoint folder " + own +
                                           " is in use by another run (pid 4343 on host h)"));
}

}  // namespace
}  // namespace dtrain
