// `dtrain train` end to end on a small model: determinism, learning, weights out and back in.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/format.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/folder_lock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/core/data/tokenizers/tokenizer_json.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Repetitive English text: a small model learns it within a few steps.
std::string TrainingText() {
  std::string text;
  for (int i = 0; i < 400; ++i) {
    absl::StrAppend(&text, "The quick brown fox jumps over the lazy dog number ", i % 10, ".\n");
  }
  return text;
}

std::string SmallRecipe() {
  const std::string data = testing::WriteTempFile("train_text.txt", TrainingText());
  return testing::WriteTempFile("small.yaml", absl::StrCat(R"(
run: {name: small, seed: 11}
model: {n_layer: 2, n_head: 2, d_model: 64, max_seq_len: 64}
data: {train: [)",
                                                           data, R"(]}
train: {steps: 12, batch_size: 8, micro_batch: 4, seq_len: 32, lr: 3.0e-3, min_lr: 3.0e-4,
        warmup_steps: 2, eval_every: 6, eval_batches: 2}
logging: {sample_tokens: 16}
)"));
}

std::vector<nlohmann::json> ReadMetrics(const std::string& run_dir) {
  std::vector<nlohmann::json> steps;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line));
  return steps;
}

std::string RunDir(const std::string& name) { return testing::TempPath("runs_" + name); }

testing::Outcome Train(const std::string& out_dir, const std::string& extra = "") {
  std::filesystem::remove_all(out_dir);
  return testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", out_dir, " ", extra));
}

// A run of a folder whose earlier run saved no checkpoint starts over: the earlier run's
// metrics and exported model, which it replaced without a word, are kept aside, said in warnings.
TEST(TrainTest, ARunStartingOverKeepsTheEarlierRunsMetricsAndModel) {
  namespace fs = std::filesystem;
  const std::string out = RunDir("start_over");
  const std::string no_checkpoint = "--set train.steps=3 --set checkpoint.save_at_end=false";
  ASSERT_EQ(Train(out, no_checkpoint).exit_code, 0);
  const std::string run = out + "/small";
  const auto bytes = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string model = bytes(run + "/model.safetensors");
  const testing::Outcome again =
      testing::RunDtrain(absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", out, " ",
                                      no_checkpoint, " --set run.seed=7"));
  ASSERT_EQ(again.exit_code, 0) << again.stderr_text;
  EXPECT_THAT(again.stderr_text,
              HasSubstr("train.export_to " + run +
                        "/model.safetensors holds an earlier run's weights, which this run "
                        "(starting at step 1) writes over at its end: kept as " +
                        run + "/model.safetensors.replaced-"));
  EXPECT_THAT(again.stderr_text, HasSubstr(run + "/metrics.jsonl: the lines of 3 step(s) past "
                                                 "step 0, where this run starts, are left out"));
  std::vector<fs::path> models, metrics;
  for (const fs::directory_entry& entry : fs::directory_iterator(run)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "model.safetensors.replaced-")) models.push_back(entry.path());
    if (absl::StartsWith(name, "metrics.jsonl.replaced-")) metrics.push_back(entry.path());
  }
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(bytes(models[0]), model);
  EXPECT_NE(bytes(run + "/model.safetensors"), model);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(testing::MetricsLosses(metrics[0].string()).size(), 3u);
}

// The same for a model folder (train.export_to without .safetensors): its files are kept in a
// folder beside it, which transformers loads as it loaded the earlier export.
TEST(TrainTest, ARunStartingOverKeepsTheEarlierRunsModelFolder) {
  namespace fs = std::filesystem;
  const std::string out = RunDir("start_over_folder");
  const std::string args =
      "--set train.steps=3 --set checkpoint.save_at_end=false --set train.export_to=hf";
  ASSERT_EQ(Train(out, args).exit_code, 0);
  const std::string folder = out + "/small/hf";
  const std::string weights = *ReadWholeFile(folder + "/model.safetensors");
  const std::string config = *ReadWholeFile(folder + "/config.json");
  const testing::Outcome again = testing::RunDtrain(absl::StrCat(
      "train ", SmallRecipe(), " --set run.out_dir=", out, " ", args, " --set run.seed=7"));
  ASSERT_EQ(again.exit_code, 0) << again.stderr_text;
  EXPECT_THAT(again.stderr_text,
              HasSubstr("train.export_to " + folder +
                        " holds an earlier run's model folder, which this run (starting at step "
                        "1) writes over at its end: kept as " +
                        folder + ".replaced-"));
  std::vector<fs::path> kept;
  for (const fs::directory_entry& entry : fs::directory_iterator(out + "/small")) {
    if (absl::StartsWith(entry.path().filename().string(), "hf.replaced-")) {
      kept.push_back(entry.path());
    }
  }
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(*ReadWholeFile((kept[0] / "model.safetensors").string()), weights);
  EXPECT_EQ(*ReadWholeFile((kept[0] / "config.json").string()), config);
  EXPECT_NE(*ReadWholeFile(folder + "/model.safetensors"), weights);
}

// The ETA counts what runs between steps: with an evaluation after every step (each reading all
// the held-out data, about as long as a step or more), the time left per step is well above the
// mean step time (it was that mean, and a small run's evaluations and samples, 30% of its time,
// finished past the ETA).
TEST(TrainTest, TheEtaCountsTheEvaluationsBetweenSteps) {
  const std::string out = RunDir("eta");
  ASSERT_EQ(Train(out,
                  "--set train.eval_every=1 --set train.eval_batches=16 --set "
                  "logging.sample_tokens=0")
                .exit_code,
            0);
  const std::vector<nlohmann::json> steps = ReadMetrics(out + "/small");
  ASSERT_EQ(steps.size(), 12u);
  double step_ms = 0;
  for (int i = 0; i < 6; ++i) step_ms += steps[i]["step_ms"].get<double>() / 6;
  const double left_ms_per_step = 1e3 * steps[5]["eta_s"].get<double>() / 6;
  EXPECT_GT(left_ms_per_step, 1.5 * step_ms);
}

TEST(TrainTest, SameRecipeAndSeedGiveBitIdenticalRuns) {
  const testing::Outcome a = Train(RunDir("a"));
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  const testing::Outcome b = Train(RunDir("b"));
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  const auto steps_a = ReadMetrics(RunDir("a") + "/small");
  const auto steps_b = ReadMetrics(RunDir("b") + "/small");
  ASSERT_EQ(steps_a.size(), 12u);
  ASSERT_EQ(steps_b.size(), 12u);
  for (size_t i = 0; i < steps_a.size(); ++i) {
    // JSON doubles print round-trip exact, so equal text means equal bits.
    EXPECT_EQ(steps_a[i]["loss"].dump(), steps_b[i]["loss"].dump()) << "step " << i + 1;
    EXPECT_EQ(steps_a[i]["grad_norm"].dump(), steps_b[i]["grad_norm"].dump());
  }
  EXPECT_EQ(steps_a[5]["val_loss"].dump(), steps_b[5]["val_loss"].dump());
}

// train.eval_batches counts batches of train.batch_size sequences, so the validation loss reads
// the same sequences at every micro-batch size: two runs that differ only in the order their
// gradients are summed give the same validation loss within that rounding. (Counted in
// micro-batches, the micro-batch of 8 read twice the sequences: 0.006 apart.)
TEST(TrainTest, ValidationLossReadsTheSameSequencesAtEveryMicroBatchSize) {
  const testing::Outcome four = Train(RunDir("micro4"));
  ASSERT_EQ(four.exit_code, 0) << four.stderr_text;
  const testing::Outcome eight = Train(RunDir("micro8"), "--set train.micro_batch=8");
  ASSERT_EQ(eight.exit_code, 0) << eight.stderr_text;
  const auto steps_four = ReadMetrics(RunDir("micro4") + "/small");
  const auto steps_eight = ReadMetrics(RunDir("micro8") + "/small");
  ASSERT_EQ(steps_four.size(), 12u);
  ASSERT_EQ(steps_eight.size(), 12u);
  for (const size_t step : {5u, 11u}) {
    EXPECT_NEAR(steps_four[step]["val_loss"].get<double>(),
                steps_eight[step]["val_loss"].get<double>(), 1e-4)
        << "step " << step + 1;
  }
}

// run.matmul_precision medium multiplies bfloat16-rounded inputs (the CPU rounds them as the
// tensor cores do): the run says so, and it follows the float32 run closely (the logits and
// gradients move by bf16's 2^-8 relative rounding, which training averages out: within 2% of
// the loss at each of the 12 steps) while not computing the same bits.
TEST(TrainTest, MediumMatmulPrecisionFollowsFloat32) {
  const testing::Outcome medium = Train(RunDir("medium"), "--set run.matmul_precision=medium");
  ASSERT_EQ(medium.exit_code, 0) << medium.stderr_text;
  EXPECT_THAT(medium.stderr_text, HasSubstr("matmul precision medium)"));
  ASSERT_EQ(Train(RunDir("highest")).exit_code, 0);
  const auto rounded = ReadMetrics(RunDir("medium") + "/small");
  const auto exact = ReadMetrics(RunDir("highest") + "/small");
  ASSERT_EQ(rounded.size(), exact.size());
  bool differs = false;
  for (size_t i = 0; i < exact.size(); ++i) {
    const double loss = exact[i]["loss"];
    EXPECT_NEAR(rounded[i]["loss"].get<double>(), loss, 0.02 * loss) << "step " << i + 1;
    differs = differs || rounded[i]["loss"].dump() != exact[i]["loss"].dump();
  }
  EXPECT_TRUE(differs) << "medium computed float32's bits: the inputs were not rounded";
  EXPECT_LT(rounded.back()["loss"].get<double>(), 0.8 * rounded.front()["loss"].get<double>());
}

TEST(TrainTest, LearnsLogsUnitsAndShowsSamples) {
  const testing::Outcome run = Train(RunDir("learn"));
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  const auto steps = ReadMetrics(RunDir("learn") + "/small");
  ASSERT_EQ(steps.size(), 12u);
  EXPECT_LT(steps.back()["loss"].get<double>(), 0.7 * steps.front()["loss"].get<double>());
  EXPECT_TRUE(steps[5].contains("val_loss"));
  EXPECT_FALSE(steps[4].contains("val_loss"));
  for (const char* key : {"tokens_per_s", "mfu_percent", "peak_rss_mib", "step_ms", "lr"}) {
    EXPECT_GT(steps.back()[key].get<double>(), 0) << key;
  }
  EXPECT_THAT(run.stderr_text, HasSubstr("step 12/12 | loss "));
  EXPECT_THAT(run.stderr_text, HasSubstr(" tok/s | MFU "));
  EXPECT_THAT(run.stderr_text, HasSubstr(" | data "));  // the data stall, in ms
  EXPECT_GE(steps.back()["data_wait_ms"].get<double>(), 0.0);
  EXPECT_THAT(run.stderr_text, HasSubstr("sample at step 6:"));
  EXPECT_TRUE(std::filesystem::exists(RunDir("learn") + "/small/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(RunDir("learn") + "/small/recipe.yaml"));
}

// Exported weights load back (fine-tuning starts where training ended): with a learning rate
// of ~0 the first evaluation of the new run equals the last evaluation of the old one.
TEST(TrainTest, ExportedWeightsInitialiseANewRun) {
  ASSERT_EQ(Train(RunDir("export")).exit_code, 0);
  const double final_val = ReadMetrics(RunDir("export") + "/small").back()["val_loss"];
  const std::string weights = RunDir("export") + "/small/model.safetensors";
  const testing::Outcome tuned =
      Train(RunDir("tune"), absl::StrCat("--set train.init_from=", weights,
                                         " --set train.lr=1e-12 --set train.min_lr=1e-12"
                                         " --set train.weight_decay=0 --set train.eval_every=1"
                                         " --set train.steps=1 --set train.warmup_steps=0"));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.stderr_text;
  EXPECT_THAT(tuned.stderr_text, HasSubstr("initialised from " + weights));
  const double first_val = ReadMetrics(RunDir("tune") + "/small").front()["val_loss"];
  EXPECT_NEAR(first_val, final_val, 1e-5 * final_val);
}

// A run that resumes its checkpoint does not load a train.init_from given since, and says so
// (the weights the first step read are in the checkpoint); nor does it count a resume from
// another run's folder, under another run.name, as a change of the recipe.
TEST(TrainTest, AResumedRunSaysItDoesNotLoadANewInitFrom) {
  ASSERT_EQ(Train(RunDir("resume_init")).exit_code, 0);
  const std::string first = RunDir("resume_init") + "/small";
  const testing::Outcome resumed = testing::RunDtrain(absl::StrCat(
      "train ", SmallRecipe(), " --set run.out_dir=", RunDir("resume_init"),
      " --set run.name=again --set checkpoint.resume=", first,
      "/checkpoints --set train.steps=13 --set train.init_from=", first, "/model.safetensors"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_THAT(resumed.stderr_text,
              AllOf(HasSubstr("step-12 was saved with other values of train.steps (12, now 13); "
                              "the recipe's values apply from now on"),
                    HasSubstr(absl::StrCat("train.init_from ", first,
                                           "/model.safetensors is not loaded: the run resumes ",
                                           first, "/checkpoints/step-12"))));
  EXPECT_THAT(resumed.stderr_text, ::testing::Not(HasSubstr("initialised from")));
}

// A checkpoint of another model shape names each key that differs with both values, and exits 2:
// no restart loads it.
TEST(TrainTest, ACheckpointOfAnotherShapeNamesBothValues) {
  const std::string dir = RunDir("other_shape");
  ASSERT_EQ(Train(dir).exit_code, 0);
  const testing::Outcome resumed = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", dir,
                   " --set model.n_layer=3 --set model.d_model=32 --set train.steps=13"));
  EXPECT_EQ(resumed.exit_code, kExitUsage) << resumed.stderr_text;
  EXPECT_THAT(resumed.stderr_text,
              HasSubstr("step-12 was saved with a different model.n_layer (2, now 3), "
                        "model.d_model (64, now 32): the model or data shape changed"));
}

// A run that fails before its first step (here: too little data for one window) leaves no
// empty folders of its making behind; an out_dir that was there stays.
TEST(TrainTest, AStartUpErrorLeavesNoEmptyRunFolder) {
  const std::string tiny = testing::WriteTempFile("one_token.txt", "x");
  const std::string out_dir = testing::FreshTempDir("startup_error") + "/a/b";
  const std::string fails = absl::StrCat("--set data.train=[", tiny, "]");
  const testing::Outcome nested = Train(out_dir, fails);
  EXPECT_EQ(nested.exit_code, 2) << nested.stderr_text;
  EXPECT_THAT(nested.stderr_text, HasSubstr("fewer than one window"));
  EXPECT_FALSE(std::filesystem::exists(testing::TempPath("startup_error")));
  std::filesystem::create_directories(out_dir);
  EXPECT_EQ(testing::RunDtrain(
                absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", out_dir, " ", fails))
                .exit_code,
            2);
  EXPECT_TRUE(std::filesystem::is_directory(out_dir));
  EXPECT_FALSE(std::filesystem::exists(out_dir + "/small"));
  // So does one that fails once it holds its run folder and checkpoint folder (here: a resume
  // from a folder that holds no checkpoint): neither the lock files nor the folders stay.
  const std::string locked_dir = testing::FreshTempDir("startup_error_locked") + "/a";
  const std::string not_a_checkpoint = testing::FreshTempDir("startup_error_not_a_checkpoint");
  std::filesystem::create_directories(not_a_checkpoint);
  const testing::Outcome locked = Train(locked_dir, "--set checkpoint.resume=" + not_a_checkpoint);
  EXPECT_EQ(locked.exit_code, 2) << locked.stderr_text;
  EXPECT_THAT(locked.stderr_text, HasSubstr(not_a_checkpoint));
  EXPECT_FALSE(std::filesystem::exists(testing::TempPath("startup_error_locked")));
  // A checkpoint.dir elsewhere that the run made stays, empty: its lock file goes.
  const std::string elsewhere = testing::FreshTempDir("startup_error_checkpoints");
  const testing::Outcome outside =
      Train(testing::FreshTempDir("startup_error_outside"),
            "--set checkpoint.resume=" + not_a_checkpoint + " --set checkpoint.dir=" + elsewhere);
  EXPECT_EQ(outside.exit_code, 2) << outside.stderr_text;
  EXPECT_TRUE(std::filesystem::is_directory(elsewhere));
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
  EXPECT_FALSE(std::filesystem::exists(testing::TempPath("startup_error_outside")));
}

// train.export_to is checked before the first step: a file where its folder would go fails the
// run at once (exit 2, no step taken, so no trained weights lost at the end), naming the file;
// a .safetensors file in folders that do not exist yet is written, the folders made.
TEST(TrainTest, AnExportPathThatCannotBeWrittenFailsBeforeTheFirstStep) {
  const std::string file = testing::TempPath("export_in_the_way");
  std::ofstream(file) << "not a folder";
  const std::string blocked = RunDir("export_blocked");
  const testing::Outcome refused =
      Train(blocked, "--set train.export_to=" + file + "/model.safetensors");
  EXPECT_EQ(refused.exit_code, 2) << refused.stderr_text;
  EXPECT_THAT(refused.stderr_text,
              AllOf(HasSubstr("train.export_to " + file + "/model.safetensors: "),
                    HasSubstr(file + " is a file, not a folder")));
  EXPECT_TRUE(ReadMetrics(blocked + "/small").empty());
  const std::string folder = testing::TempPath("export_folder.safetensors");
  std::filesystem::create_directories(folder);
  const testing::Outcome taken = Train(blocked, "--set train.export_to=" + folder);
  EXPECT_EQ(taken.exit_code, 2) << taken.stderr_text;
  EXPECT_THAT(taken.stderr_text, HasSubstr(folder + " is a folder"));
  // A folder that root may write by access(2) but where no file can be made (/proc) is refused
  // too, where the run failed after its last step.
  const testing::Outcome proc =
      Train(RunDir("export_proc"), "--set train.export_to=/proc/dtrain/model.safetensors");
  EXPECT_EQ(proc.exit_code, 2) << proc.stderr_text;
  EXPECT_THAT(proc.stderr_text, HasSubstr("train.export_to /proc/dtrain/model.safetensors: no file "
                                          "can be made in /proc (making one there failed: "));
  EXPECT_TRUE(ReadMetrics(RunDir("export_proc") + "/small").empty());

  const testing::Outcome nested =
      Train(RunDir("export_nested"), "--set train.export_to=weights/final/model.safetensors");
  ASSERT_EQ(nested.exit_code, 0) << nested.stderr_text;
  EXPECT_TRUE(
      std::filesystem::exists(RunDir("export_nested") + "/small/weights/final/model.safetensors"));
}

// train.export_to without .safetensors writes a Hugging Face folder, which train.init_from takes
// back: its config.json gives the model keys a recipe leaves unset, and is checked against those
// it sets. Its tokenizer of one token per byte is the data's (bytes), so no warning says otherwise.
TEST(TrainTest, ExportedFolderInitialisesANewRunAndItsConfigMustMatch) {
  ASSERT_EQ(Train(RunDir("folder"), "--set train.export_to=hf-model").exit_code, 0);
  const std::string folder = RunDir("folder") + "/small/hf-model";
  EXPECT_TRUE(std::filesystem::exists(folder + "/model.safetensors"));
  const nlohmann::json config =
      nlohmann::json::parse(std::ifstream(folder + "/config.json"), nullptr, false);
  EXPECT_EQ(config.value("model_type", ""), "gpt2");
  EXPECT_EQ(config.value("n_embd", 0), 64);
  // The run trained on bytes: its folder, and its checkpoint's export, get their tokenizer.
  EXPECT_TRUE(std::filesystem::exists(folder + "/tokenizer.json"));
  const std::string exported = testing::FreshTempDir("bytes_export");
  const testing::Outcome from_checkpoint = testing::RunDtrain(absl::StrCat(
      "ckpt export ", RunDir("folder"), "/small/checkpoints --format hf --out ", exported));
  ASSERT_EQ(from_checkpoint.exit_code, 0) << from_checkpoint.stderr_text;
  EXPECT_TRUE(std::filesystem::exists(exported + "/tokenizer.json"));
  const double final_val = ReadMetrics(RunDir("folder") + "/small").back()["val_loss"];
  const std::string near_zero_lr =
      " --set train.lr=1e-12 --set train.min_lr=1e-12 --set train.weight_decay=0"
      " --set train.eval_every=1 --set train.steps=1 --set train.warmup_steps=0";
  std::string shapeless = ReadWholeFile(SmallRecipe()).value();
  const size_t model_line = shapeless.find("model: {");
  ASSERT_NE(model_line, std::string::npos);
  shapeless.erase(model_line, shapeless.find('\n', model_line) + 1 - model_line);
  std::filesystem::remove_all(RunDir("from_folder"));
  const std::string from_folder =
      absl::StrCat("train ", testing::WriteTempFile("shapeless.yaml", shapeless),
                   " --set run.out_dir=", RunDir("from_folder"), " --set train.init_from=", folder,
                   near_zero_lr);
  const testing::Outcome tuned = testing::RunDtrain(from_folder);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.stderr_text;
  EXPECT_THAT(tuned.stderr_text, HasSubstr("gpt2, 2 layers, d_model 64, 2 heads"));
  EXPECT_THAT(tuned.stderr_text, ::testing::Not(HasSubstr("carries tokenizer")));
  EXPECT_NEAR(ReadMetrics(RunDir("from_folder") + "/small").front()["val_loss"].get<double>(),
              final_val, 1e-5 * final_val);
  // Its resume takes the shape from the folder again: with config.json gone, the refusal says so.
  std::filesystem::rename(folder + "/config.json", folder + "/config.json.away");
  const testing::Outcome resumed = testing::RunDtrain(from_folder + " --set train.steps=2");
  std::filesystem::rename(folder + "/config.json.away", folder + "/config.json");
  EXPECT_EQ(resumed.exit_code, 2) << resumed.stderr_text;
  EXPECT_THAT(resumed.stderr_text, HasSubstr("train.init_from " + folder +
                                             " has no config.json here to give those the recipe "
                                             "leaves unset"));

  const testing::Outcome wrong =
      Train(RunDir("folder_wrong"),
            "--set train.init_from=" + folder + " --set model.d_model=32 --set model.n_layer=3");
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_THAT(wrong.stderr_text, HasSubstr(folder + "/config.json does not match"));
  EXPECT_THAT(wrong.stderr_text, HasSubstr("model.d_model is 32 but n_embd is 64 (set "
                                           "model.d_model: 64)"));
  EXPECT_THAT(wrong.stderr_text, HasSubstr("model.n_layer is 3 but n_layer is 2"));
  // recipe check and plan refuse it alike, where they ran on the built-in default model.
  for (const char* command : {"recipe check", "plan"}) {
    const testing::Outcome checked = testing::RunDtrain(absl::StrCat(
        command, " ", SmallRecipe(), " --set train.init_from=", folder, " --set model.n_layer=3"));
    EXPECT_EQ(checked.exit_code, 2) << command << ": " << checked.stderr_text;
    EXPECT_THAT(checked.stderr_text, HasSubstr("model.n_layer is 3 but n_layer is 2")) << command;
  }

  // Without its weights the folder is a usage error too (it exited 1, which launch restarts).
  std::filesystem::remove(folder + "/model.safetensors");
  const testing::Outcome weightless =
      Train(RunDir("folder_weightless"), "--set train.init_from=" + folder);
  EXPECT_EQ(weightless.exit_code, 2) << weightless.stderr_text;
  EXPECT_THAT(weightless.stderr_text, HasSubstr(folder + " has config.json but no "));
}

// A Llama tuned on shorter sequences than its starting folder's context keeps that context in
// its exports (train.export_to's and ckpt export's): Llama has no position tensor, and a folder
// that said max_position_embeddings 64 would cap what transformers and servers give it. The run
// names the folder relative to where it runs; ckpt export, run elsewhere, finds it through the
// checkpoint's record of that place, and says so where the folder is gone.
TEST(TrainTest, ALlamaExportKeepsTheContextOfItsStartingFolder) {
  const std::string llama = "--set model.family=llama --set train.steps=2 --set train.eval_every=0";
  ASSERT_EQ(Train(RunDir("llama_base"), llama + " --set train.export_to=hf").exit_code, 0);
  const std::string base = RunDir("llama_base") + "/small/hf";
  nlohmann::json config = nlohmann::json::parse(std::ifstream(base + "/config.json"));
  ASSERT_EQ(config["max_position_embeddings"], 64);  // the context it trained, with no folder
  config["max_position_embeddings"] = 8192;          // a base model trained on longer sequences
  std::ofstream(base + "/config.json") << config.dump(2);

  const std::filesystem::path work = std::filesystem::path(base).parent_path().parent_path();
  const std::string tuned_dir = RunDir("llama_tuned");
  std::filesystem::remove_all(tuned_dir);
  const testing::Outcome tuned = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", tuned_dir, " ", llama,
                   " --set train.export_to=hf --set train.init_from=small/hf"),
      "cd " + work.string() + " &&");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.stderr_text;
  const std::string checkpoints = tuned_dir + "/small/checkpoints";
  const std::string exported = testing::FreshTempDir("llama_tuned_export");
  const testing::Outcome from_checkpoint = testing::RunDtrain(
      absl::StrCat("ckpt export ", checkpoints, " --format hf --out ", exported));
  ASSERT_EQ(from_checkpoint.exit_code, 0) << from_checkpoint.stderr_text;
  for (const std::string& folder : {tuned_dir + "/small/hf", exported}) {
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(folder + "/config.json"))
                  .value("max_position_embeddings", 0),
              8192)
        << folder;
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(folder + "/tokenizer_config.json"))
                  .value("model_max_length", 0),
              8192)
        << folder;
  }

  const std::string run_started = std::filesystem::canonical(work).string() + "/small/hf";
  std::filesystem::remove_all(base);
  const testing::Outcome gone = testing::RunDtrain(
      absl::StrCat("ckpt export ", checkpoints, " --format hf --out ", exported, "_gone"));
  ASSERT_EQ(gone.exit_code, 0) << gone.stderr_text;
  EXPECT_THAT(gone.stderr_text, HasSubstr("train.init_from " + run_started +
                                          ", where the run started, is not here: config.json's "
                                          "max_position_embeddings is model.max_seq_len, 64"));
}

// parallel.strategy: auto takes the planner's layout for this world (one process here) among
// the layouts the trainer runs, and says which. On the CPU it plans in this machine's memory
// (cluster.gpu's, here too small for the model, once refused every layout) and takes the
// simplest layout that fits: the plan's GPU timings do not rank CPU ranks' layouts (they put
// zero3 first for this model on 2 ranks, measured the slowest).
// auto chooses micro_batch and recompute too, and says which of the recipe's values it replaced.
TEST(TrainTest, AutoStrategyRunsThePlannedLayout) {
  const testing::Outcome run = Train(RunDir("auto"),
                                     "--set parallel.strategy=auto --set train.steps=2 --set "
                                     "cluster.gpu_memory_gib=0.01 --set parallel.recompute=full");
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("parallel.strategy auto: "));
  EXPECT_THAT(run.stderr_text, HasSubstr("micro_batch 8 (in place of the recipe's 4)"));
  EXPECT_THAT(run.stderr_text, HasSubstr("recompute none (in place of the recipe's full)"));
  EXPECT_THAT(run.stderr_text, HasSubstr("(the simplest layout that fits for 1 rank of "));
  EXPECT_THAT(run.stderr_text, HasSubstr(" of this machine's memory)"));
  EXPECT_EQ(ReadMetrics(RunDir("auto") + "/small").size(), 2u);
}

// A checkpoint folder that cannot be written is an error before the first step, not at the
// first save after the run's steps (at the end, with checkpoint.interval 0); exit 2, which the
// agent does not restart (each restart found the folder so again).
TEST(TrainTest, AnUnwritableCheckpointFolderFailsBeforeTraining) {
  // Under a regular file no folder can be made, whoever runs the test (root included).
  const std::string file = testing::WriteTempFile("not_a_folder", "x");
  const testing::Outcome run =
      Train(RunDir("ckpt_dir"), absl::StrCat("--set checkpoint.dir=", file, "/checkpoints"));
  EXPECT_EQ(run.exit_code, kExitUsage) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr(absl::StrCat("checkpoint.dir ", file,
                                                      "/checkpoints cannot hold this run's "
                                                      "checkpoints: cannot create it")));
  EXPECT_THAT(run.stderr_text, ::testing::Not(HasSubstr("step 1/")));
  // A file system that makes no folder and says none exists (ENOENT, under /proc) is one too.
  const testing::Outcome proc =
      Train(RunDir("ckpt_dir_proc"), "--set checkpoint.dir=/proc/dtrain-checkpoints");
  EXPECT_EQ(proc.exit_code, kExitUsage) << proc.stderr_text;
  EXPECT_THAT(proc.stderr_text, HasSubstr("checkpoint.dir /proc/dtrain-checkpoints cannot hold"));
}

// A run folder another process is training in is refused before anything of it is read or
// written, naming the holder, with exit 2 (a restart by the agent would find it held again); it
// is free again once that process ends.
TEST(TrainTest, ARunFolderInUseIsRefusedNamingItsHolder) {
  const std::string dir = RunDir("locked");
  std::filesystem::remove_all(dir);
  {
    absl::StatusOr<FolderLock> held =
        FolderLock::AcquireAs(dir + "/small", FolderLock::kRunFolder, "pid 4242 on host h");
    ASSERT_TRUE(held.ok()) << held.status();
    const testing::Outcome second =
        testing::RunDtrain(absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", dir));
    EXPECT_EQ(second.exit_code, kExitUsage) << second.stderr_text;
    EXPECT_THAT(second.stderr_text, HasSubstr("/small is in use by another run (pid 4242 on host "
                                              "h); give this run another run.name"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/small/metrics.jsonl"));
  }
  EXPECT_EQ(Train(dir).exit_code, 0);
}

// Weights of another shape are a usage error before the run starts (exit 2, which `dtrain launch`
// does not restart), found from the file's header: no run folder is written.
TEST(TrainTest, InitFromAnotherShapeFailsNamingTheTensor) {
  ASSERT_EQ(Train(RunDir("shape")).exit_code, 0);
  const std::string weights = RunDir("shape") + "/small/model.safetensors";
  const testing::Outcome wrong = Train(
      RunDir("wrong"), absl::StrCat("--set train.init_from=", weights, " --set model.d_model=32"));
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_THAT(wrong.stderr_text, HasSubstr(weights));
  EXPECT_THAT(wrong.stderr_text, HasSubstr("wte.weight"));
  EXPECT_FALSE(std::filesystem::exists(RunDir("wrong") + "/small"));
}

// Weights holding a NaN are refused naming the tensor and element, before the first step (which
// failed with a NaN loss and advice to lower train.lr).
TEST(TrainTest, InitFromWeightsHoldingANanFailsNamingTheTensor) {
  ASSERT_EQ(Train(RunDir("nan_source")).exit_code, 0);
  const std::string weights = RunDir("nan_source") + "/small/model.safetensors";
  {
    std::fstream file(weights, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    file.read(reinterpret_cast<char*>(&header_bytes), sizeof(header_bytes));
    std::string header(header_bytes, '\0');
    file.read(header.data(), static_cast<std::streamsize>(header.size()));
    const int64_t begin =
        nlohmann::json::parse(header)["wte.weight"]["data_offsets"][0].get<int64_t>();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    file.seekp(static_cast<std::streamoff>(8 + header_bytes + begin + 5 * sizeof(float)));
    file.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
  }
  const testing::Outcome run = Train(RunDir("nan"), "--set train.init_from=" + weights);
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr(absl::StrCat("train.init_from: ", weights,
                                                      ": tensor 'wte.weight' holds nan at "
                                                      "element 5 of ")));
  EXPECT_THAT(run.stderr_text, ::testing::Not(HasSubstr("train.lr")));
}

// A run that diverges says at which step, and exits 2: the same recipe and data diverge the same
// way after a restart (dtrain launch spent its restarts on it). Decoupled weight decay of 1e12
// multiplies each weight by about -lr x 1e12 a step.
TEST(TrainTest, ADivergedRunNamesTheStepAndExits2) {
  const testing::Outcome run = Train(RunDir("diverged"), "--set train.weight_decay=1e12");
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, ::testing::ContainsRegex("error: step [0-9]+: the loss is "));
  EXPECT_THAT(run.stderr_text,
              HasSubstr("lower train.lr (or train.weight_decay), or raise train.warmup_steps"));
  // Weights that give no finite loss before any update are not the learning rate's doing.
  const testing::Outcome start = Train(RunDir("diverged_start"), "--set model.init_std=1e30");
  EXPECT_EQ(start.exit_code, 2) << start.stderr_text;
  EXPECT_THAT(start.stderr_text, HasSubstr("error: step 1: the loss is "));
  EXPECT_THAT(start.stderr_text, HasSubstr(" before any update, so the weights the run started "
                                           "from give them: check model.init_std"));
}

// Files the recipe names that do not exist fail the same way at every restart: exit 2, which
// `dtrain launch` does not restart.
TEST(TrainTest, MissingWeightsOrDataAreUsageErrors) {
  const testing::Outcome weights =
      Train(RunDir("no_weights"), "--set train.init_from=" + RunDir("no_weights") + "/nope");
  EXPECT_EQ(weights.exit_code, 2) << weights.stderr_text;
  EXPECT_THAT(weights.stderr_text,
              HasSubstr("train.init_from: " + RunDir("no_weights") +
                        "/nope does not exist; give a .safetensors file or a Hugging Face "
                        "model folder"));
  const testing::Outcome data =
      Train(RunDir("no_data"), "--set data.train=[" + RunDir("no_data") + "/nope.txt]");
  EXPECT_EQ(data.exit_code, 2) << data.stderr_text;
  EXPECT_THAT(data.stderr_text, HasSubstr("/nope.txt' matches no file"));
  // dtrain's own files that are no weights say what takes them: a checkpoint (its folder or a
  // step's), llm.c's model file that ckpt export writes.
  const std::string run = RunDir("init_from_own");
  ASSERT_EQ(Train(run, "--set train.steps=2").exit_code, 0);
  const std::string checkpoints = run + "/small/checkpoints";
  for (const std::string& checkpoint : {checkpoints, checkpoints + "/step-2"}) {
    const testing::Outcome from_checkpoint =
        Train(RunDir("from_checkpoint"), "--set train.init_from=" + checkpoint);
    EXPECT_EQ(from_checkpoint.exit_code, 2) << from_checkpoint.stderr_text;
    EXPECT_THAT(from_checkpoint.stderr_text,
                HasSubstr("train.init_from: " + checkpoint +
                          " is a dtrain checkpoint, not model weights: resume it with "
                          "checkpoint.resume: " +
                          checkpoint));
  }
  // Weights named like a step are weights.
  const std::string stepped = run + "/step-5.safetensors";
  std::filesystem::copy_file(run + "/small/model.safetensors", stepped);
  const testing::Outcome from_stepped =
      Train(RunDir("from_stepped"), "--set train.steps=1 --set train.init_from=" + stepped);
  EXPECT_EQ(from_stepped.exit_code, 0) << from_stepped.stderr_text;
  const std::string llmc = run + "/model.bin";
  ASSERT_EQ(
      testing::RunDtrain(absl::StrCat("ckpt export ", checkpoints, " --format llmc --out ", llmc))
          .exit_code,
      0);
  const testing::Outcome from_llmc = Train(RunDir("from_llmc"), "--set train.init_from=" + llmc);
  EXPECT_EQ(from_llmc.exit_code, 2) << from_llmc.stderr_text;
  EXPECT_THAT(from_llmc.stderr_text,
              HasSubstr("train.init_from: " + llmc +
                        " is llm.c's GPT-2 model file, which dtrain writes (`ckpt export "
                        "--format llmc`) but does not read"));
  // A URL there says which format streams URLs, not that no file matches.
  const testing::Outcome url =
      Train(RunDir("url_data"), "--set data.train=[http://127.0.0.1:9/corpus.txt]");
  EXPECT_EQ(url.exit_code, 2) << url.stderr_text;
  EXPECT_THAT(url.stderr_text,
              HasSubstr("file pattern 'http://127.0.0.1:9/corpus.txt' is a URL or a command, but "
                        "data.format text, llmc and sft read local files whole"));
}

// A train.no_decay glob that matches no tensor (here GPT-2's head, which is its embedding) would
// exempt nothing: exit 2 before the data is read.
TEST(TrainTest, NoDecayGlobThatMatchesNothingIsAUsageError) {
  const testing::Outcome run =
      Train(RunDir("no_decay"), "--set 'train.no_decay=[\"*norm*\", \"lm_head.weight\"]'");
  EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("train.no_decay: 'lm_head.weight' matches no tensor of "
                                         "this gpt2 model"));
  EXPECT_THAT(run.stderr_text, ::testing::Not(HasSubstr("data:")));
}

// The run's output files must be apart from one another and from its own (the resolved recipe,
// the lock), and none a device: refused before anything is written, naming the key. Renamed over,
// /dev/null became a file of metrics. An export into the run folder itself trains as before.
TEST(TrainTest, OutputFilesInEachOthersWayAreUsageErrors) {
  const std::string fifo = testing::TempPath("metrics_fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << strerror(errno);
  // A file of something else: a fresh run wrote its metrics over a recipe.
  const std::string recipe_file = testing::WriteTempFile("not_metrics.yaml", "run: {}\n");
  const std::string model_file = testing::WriteTempFile("not_weights.safetensors", "run: {}\n");
  const struct {
    std::string sets, named;
  } cases[] = {
      {"--set logging.metrics_file=" + recipe_file,
       "logging.metrics_file '" + recipe_file + "' is " + recipe_file +
           ", a file of something else (its first line is no step's metrics), which the run "
           "would write over"},
      {"--set train.export_to=" + model_file,
       "train.export_to " + model_file + ": " + model_file + " exists and is no safetensors file"},
      {"--set logging.metrics_file=recipe.yaml",
       "logging.metrics_file 'recipe.yaml' is the run's resolved recipe, recipe.yaml"},
      {"--set logging.metrics_file=", "logging.metrics_file '' is the run folder, or holds it"},
      {"--set logging.metrics_file=" + fifo, "logging.metrics_file: " + fifo + " is a FIFO"},
      {"--set train.export_to=metrics.jsonl",
       "train.export_to 'metrics.jsonl' is logging.metrics_file: give the model a path of its "
       "own"},
      {"--set train.export_to=recipe.yaml",
       "train.export_to 'recipe.yaml' is the run's resolved recipe"},
      // The run folder may hold the model, but not a metrics file under one of its names.
      {"--set train.export_to=. --set logging.metrics_file=config.json",
       "logging.metrics_file 'config.json' is a file of train.export_to's model folder"},
  };
  for (const auto& [sets, named] : cases) {
    const testing::Outcome run = Train(RunDir("outputs"), "--set run.name=t " + sets);
    EXPECT_EQ(run.exit_code, 2) << sets << "\n" << run.stderr_text;
    EXPECT_THAT(run.stderr_text, HasSubstr("error: " + named)) << sets;
    EXPECT_FALSE(std::filesystem::exists(RunDir("outputs") + "/t/recipe.yaml")) << sets;
  }
  EXPECT_EQ(*ReadWholeFile(recipe_file), "run: {}\n");
  EXPECT_EQ(*ReadWholeFile(model_file), "run: {}\n");
  struct stat info;
  ASSERT_EQ(::stat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  std::filesystem::remove(fifo);
  const testing::Outcome in_run_folder =
      Train(RunDir("outputs"), "--set run.name=t --set train.steps=2 --set train.export_to=.");
  EXPECT_EQ(in_run_folder.exit_code, 0) << in_run_folder.stderr_text;
  EXPECT_TRUE(std::filesystem::exists(RunDir("outputs") + "/t/config.json"));
  EXPECT_TRUE(std::filesystem::exists(RunDir("outputs") + "/t/metrics.jsonl"));
  // Metrics whose first line a crash cut off are metrics still: a fresh run writes them anew.
  const std::string cut = testing::WriteTempFile("cut_metrics.jsonl", "{\"step\": 1, \"lo");
  const testing::Outcome over_cut =
      Train(RunDir("outputs"), "--set train.steps=2 --set logging.metrics_file=" + cut);
  EXPECT_EQ(over_cut.exit_code, 0) << over_cut.stderr_text;
  EXPECT_THAT(*ReadWholeFile(cut), HasSubstr("\"step\":2"));
}

// train.eval_batches beyond the validation set ends the evaluation at the set's end, on every
// rank together: a hundred million batches evaluate what a hundred do (it used to run the
// model on empty batches for as long as asked).
TEST(TrainTest, EvaluationEndsWithTheValidationSet) {
  const std::string sets = "--set train.steps=2 --set train.eval_every=2 --set train.eval_batches=";
  const testing::Outcome all = Train(RunDir("eval_all"), sets + "100");
  ASSERT_EQ(all.exit_code, 0) << all.stderr_text;
  const testing::Outcome huge = Train(RunDir("eval_huge"), sets + "100000000");
  ASSERT_EQ(huge.exit_code, 0) << huge.stderr_text;
  const auto steps_all = ReadMetrics(RunDir("eval_all") + "/small");
  const auto steps_huge = ReadMetrics(RunDir("eval_huge") + "/small");
  ASSERT_EQ(steps_all.size(), 2u);
  ASSERT_EQ(steps_huge.size(), 2u);
  EXPECT_EQ(steps_all[1]["val_loss"].dump(), steps_huge[1]["val_loss"].dump());
}

// A directory as a data file used to read as 2^63 - 1 bytes and abort in bad_alloc. It, and a
// file too short for one window, exit 2: a restart would read the same.
TEST(TrainTest, DataDirectoryFailsNamingIt) {
  const std::string dir = testing::FreshTempDir("data_dir");
  std::filesystem::create_directories(dir);
  const testing::Outcome run = Train(RunDir("data_dir"), "--set data.train=[" + dir + "]");
  EXPECT_EQ(run.exit_code, kExitUsage);
  EXPECT_THAT(run.stderr_text, HasSubstr("data file " + dir + " is a directory"));
  const std::string empty = testing::WriteTempFile("empty_data.txt", "");
  const testing::Outcome short_data =
      Train(RunDir("data_empty"), "--set data.train=[" + empty + "]");
  EXPECT_EQ(short_data.exit_code, kExitUsage) << short_data.stderr_text;
  EXPECT_THAT(short_data.stderr_text, HasSubstr("0 tokens is fewer than one window"));
}

// An archive named in data.train under data.format text would train on its bytes: WebDataset
// shards (their tar headers and token ids) or a gzip file. Exit 2, naming the fix.
TEST(TrainTest, ArchivesAreNoTextToTrainOn) {
  const std::string shards = testing::FreshTempDir("text_shards");
  const testing::Outcome pack = testing::RunDtrain(
      absl::StrCat("data pack ", testing::WriteTempFile("text_shards.txt", std::string(4000, 'a')),
                   " --out ", shards));
  ASSERT_EQ(pack.exit_code, 0) << pack.stderr_text;
  const testing::Outcome tar =
      Train(RunDir("text_tar"), "--set data.train=[" + shards + "/shard-000000.tar]");
  EXPECT_EQ(tar.exit_code, kExitUsage) << tar.stderr_text;
  EXPECT_THAT(tar.stderr_text,
              HasSubstr("shard-000000.tar is a tar archive, whose headers data.format text would "
                        "train on as tokens: for WebDataset shards"));
  const std::string gzip =
      testing::WriteTempFile("text_corpus.txt.gz", std::string("\x1f\x8b\x08\x00", 4) + "x");
  const testing::Outcome gz = Train(RunDir("text_gz"), "--set data.train=[" + gzip + "]");
  EXPECT_EQ(gz.exit_code, kExitUsage) << gz.stderr_text;
  EXPECT_THAT(gz.stderr_text, HasSubstr("text_corpus.txt.gz is a gzip archive, whose bytes "
                                        "data.format text would train on as tokens: unpack it "
                                        "first (gunzip -c)"));
}

// Within dtrain's size bound but far beyond this machine: refused before allocating, naming
// what one rank needs; exit 2, since no restart gives the machine more memory.
TEST(TrainTest, ModelTooLargeForTheMachineFailsBeforeAllocating) {
  const testing::Outcome run =
      Train(RunDir("huge"), "--set model.n_layer=4096 --set model.d_model=8192");
  EXPECT_EQ(run.exit_code, kExitUsage);
  EXPECT_THAT(run.stderr_text, HasSubstr("error: one rank needs "));
  EXPECT_THAT(run.stderr_text, HasSubstr("but this machine has"));
}

// Every rank reads the same recipe, so its warnings are rank 0's to print: a deprecated key warns
// once a job, not once a rank. train.lr: -1 ends the load before any rendezvous.
TEST(TrainTest, RecipeWarningsArePrintedByRankZeroOnly) {
  const std::string args = absl::StrCat(
      "train ", SmallRecipe(), " --set parallel.activation_checkpointing=true --set train.lr=-1");
  for (const int rank : {0, 1}) {
    const testing::Outcome run = testing::RunDtrain(
        args, absl::StrCat("RANK=", rank, " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1"));
    EXPECT_EQ(run.exit_code, 2) << run.stderr_text;
    EXPECT_THAT(run.stderr_text, HasSubstr("train.lr"));
    EXPECT_EQ(run.stderr_text.find("deprecated") != std::string::npos, rank == 0)
        << "rank " << rank << ": " << run.stderr_text;
  }
}

// The resolved recipe names its file, and the checkpoint manifest embeds it: a file name that
// is not UTF-8 must not make the save throw (it used to abort at the first checkpoint).
TEST(TrainTest, RecipeFileNameThatIsNotUtf8StillCheckpoints) {
  const std::string odd = testing::TempPath("recipe_\xff.yaml");
  std::filesystem::copy_file(SmallRecipe(), odd, std::filesystem::copy_options::overwrite_existing);
  const std::string out_dir = RunDir("odd_name");
  std::filesystem::remove_all(out_dir);
  const testing::Outcome run =
      testing::RunDtrain(absl::StrCat("train '", odd, "' --set run.out_dir=", out_dir,
                                      " --set train.steps=2 --set train.eval_every=0"));
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  std::ifstream manifest(out_dir + "/small/checkpoints/step-2/manifest.json");
  const nlohmann::json json = nlohmann::json::parse(manifest);
  EXPECT_THAT(json["recipe"].get<std::string>(), HasSubstr("recipe_\xef\xbf\xbd.yaml"));
}

// checkpoint.save_at_end: false (a benchmark's runs) writes the interval's checkpoints and not the
// last step's, which every run writes by default.
TEST(TrainTest, SaveAtEndFalseLeavesTheLastStepUnsaved) {
  const std::string steps = " --set train.steps=3 --set train.eval_every=0";
  for (const bool save_at_end : {true, false}) {
    const std::string out_dir = RunDir(save_at_end ? "save_at_end" : "no_save_at_end");
    const testing::Outcome run = Train(out_dir, absl::StrCat(steps,
                                                             " --set checkpoint.interval=2 --set "
                                                             "checkpoint.save_at_end=",
                                                             save_at_end ? "true" : "false"));
    ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
    const std::string checkpoints = out_dir + "/small/checkpoints";
    EXPECT_TRUE(std::filesystem::exists(checkpoints + "/step-2/manifest.json"));
    EXPECT_EQ(std::filesystem::exists(checkpoints + "/step-3"), save_at_end);
  }
}

// A full checkpoint file system says how much is free, how much the save needed and what to do
// (it said only "No space left on device"), and exits kExitDiskFull: a restart would fail at the
// same save. The file system is a 64 KiB tmpfs in a mount namespace of the run's own.
TEST(TrainTest, AFullCheckpointFileSystemSaysWhatToDo) {
  const std::string small = testing::FreshTempDir("full_checkpoints");
  const std::string prefix = testing::SmallFileSystemPrefix(small, 64);
  if (prefix.empty()) GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  const testing::Outcome run = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", RunDir("full"),
                   " --set checkpoint.dir=", small, " --set train.steps=2"),
      prefix);
  EXPECT_EQ(run.exit_code, kExitDiskFull) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("checkpoint step-2, rank 0: write "));
  EXPECT_THAT(run.stderr_text, HasSubstr("No space left on device"));
  EXPECT_THAT(run.stderr_text,
              ::testing::ContainsRegex("the checkpoint folder's file system is full \\([0-9.]+ "
                                       "MiB free, this rank's part is [0-9.]+ MiB\\)"));
  EXPECT_THAT(run.stderr_text, HasSubstr("keep fewer checkpoints (checkpoint.keep_last is 3)"));
  // Keeping one, fewer is none: not offered.
  const testing::Outcome one = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", RunDir("full_one"),
                   " --set checkpoint.dir=", small, " --set train.steps=2",
                   " --set checkpoint.keep_last=1"),
      prefix);
  EXPECT_EQ(one.exit_code, kExitDiskFull) << one.stderr_text;
  EXPECT_THAT(one.stderr_text, AllOf(HasSubstr("free space there, or set checkpoint.dir"),
                                     Not(HasSubstr("keep fewer"))));
}

// A metrics line that cannot be written fails the run, naming the file and why, with the full
// disk's exit code (the run went on without them and exited 0). The run folder is a 64 KiB tmpfs;
// the checkpoints go elsewhere.
TEST(TrainTest, AMetricsFileThatCannotBeWrittenFailsTheRun) {
  const std::string small = testing::FreshTempDir("full_run_folder");
  const std::string prefix = testing::SmallFileSystemPrefix(small, 64);
  if (prefix.empty()) GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  const testing::Outcome run = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", small,
                   " --set checkpoint.dir=", RunDir("full_run_folder_checkpoints"),
                   " --set train.steps=1000 --set train.eval_every=0 --set train.export_to=''"),
      prefix);
  EXPECT_EQ(run.exit_code, kExitDiskFull) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("write " + small + "/small/metrics.jsonl"));
  EXPECT_THAT(run.stderr_text, HasSubstr("No space left on device"));
}

// A background save that fails ends the run at the step it is found, not at the next save's,
// checkpoint.interval steps later (when the writer waited for it): the run trained on for nothing.
TEST(TrainTest, AFailedBackgroundSaveEndsTheRunBeforeTheNextSave) {
  const std::string small = testing::FreshTempDir("full_async_checkpoints");
  const std::string prefix = testing::SmallFileSystemPrefix(small, 64);
  if (prefix.empty()) GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  const std::string out = RunDir("full_async");
  std::filesystem::remove_all(out);
  const testing::Outcome run = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", out, " --set checkpoint.dir=",
                   small, " --set checkpoint.async=true --set checkpoint.interval=100",
                   " --set train.steps=400 --set train.eval_every=0 --set train.export_to=''"),
      prefix);
  EXPECT_EQ(run.exit_code, kExitDiskFull) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("checkpoint step-100, rank 0: write "));
  const std::vector<nlohmann::json> steps = ReadMetrics(out + "/small");
  ASSERT_FALSE(steps.empty());
  EXPECT_GE(steps.back()["step"].get<int>(), 100);
  EXPECT_LT(steps.back()["step"].get<int>(), 199);
}

// Out of inodes with bytes to spare the error says so, not that the file system is full.
TEST(TrainTest, ACheckpointFileSystemOutOfInodesSaysSo) {
  const std::string small = testing::FreshTempDir("inode_checkpoints");
  const std::string prefix = testing::SmallFileSystemPrefix(small, 8192, ",nr_inodes=2");
  if (prefix.empty()) GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  const testing::Outcome run = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", RunDir("inodes"),
                   " --set checkpoint.dir=", small, " --set train.steps=2"),
      prefix);
  EXPECT_EQ(run.exit_code, kExitDiskFull) << run.stderr_text;
  EXPECT_THAT(run.stderr_text,
              HasSubstr("the checkpoint folder's file system has no free inodes (files) left"));
  EXPECT_THAT(run.stderr_text, ::testing::Not(HasSubstr("is full")));
}

// Under `ulimit -f` the first save used to end the process with SIGXFSZ and no word (and
// `dtrain launch` retrained to the same save): the write fails, names the limit and exits 3.
TEST(TrainTest, AFileSizeLimitStopsTheSaveNamingTheLimit) {
  const testing::Outcome run = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", RunDir("fsize"),
                   " --set train.steps=2"),
      "bash -c 'ulimit -f 200 && exec \"$0\" \"$@\"'");
  EXPECT_EQ(run.exit_code, kExitDiskFull) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("checkpoint step-2, rank 0: write "));
  EXPECT_THAT(run.stderr_text,
              HasSubstr("file-size limit (ulimit -f) stops files at 204800 bytes: raise it"));
}

// Files that a restart finds as they are fail once: a run folder on a read-only file system
// exits 2, a full one while writing the run's recipe.yaml or train.export_to's weights exits 3.
TEST(TrainTest, AReadOnlyOrFullRunFolderIsNotRestarted) {
  const std::string read_only = testing::FreshTempDir("ro_runs");
  const std::string ro_prefix = testing::SmallFileSystemPrefix(read_only, 64, ",ro");
  if (ro_prefix.empty()) GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  const testing::Outcome ro = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", read_only), ro_prefix);
  EXPECT_EQ(ro.exit_code, kExitUsage) << ro.stderr_text;
  EXPECT_THAT(ro.stderr_text, HasSubstr("cannot create the run folder " + read_only +
                                        "/small: Read-only file system; set run.out_dir"));

  // One page: the lock file's holder fits, recipe.yaml does not.
  const std::string tiny = testing::FreshTempDir("full_runs");
  const testing::Outcome recipe =
      testing::RunDtrain(absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", tiny,
                                      " --set checkpoint.dir=", RunDir("full_runs_checkpoints")),
                         testing::SmallFileSystemPrefix(tiny, 4));
  EXPECT_EQ(recipe.exit_code, kExitDiskFull) << recipe.stderr_text;
  EXPECT_THAT(recipe.stderr_text, HasSubstr("/small/recipe.yaml.tmp: No space left on device"));

  const std::string exports = testing::FreshTempDir("full_exports");
  const testing::Outcome exported = testing::RunDtrain(
      absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", RunDir("full_export"),
                   " --set train.steps=2 --set train.export_to=", exports, "/model.safetensors"),
      testing::SmallFileSystemPrefix(exports, 64));
  EXPECT_EQ(exported.exit_code, kExitDiskFull) << exported.stderr_text;
  EXPECT_THAT(exported.stderr_text, HasSubstr("/model.safetensors.tmp: No space left on device"));
}

// A data file this user may not read is the recipe's files' error: exit 2, not restarted.
TEST(TrainTest, AnUnreadableDataFileIsAUsageError) {
  const std::string data = testing::WriteTempFile("secret.txt", TrainingText());
  std::filesystem::permissions(data, std::filesystem::perms::none);
  const std::string out = RunDir("secret");
  std::filesystem::create_directories(out);
  std::filesystem::permissions(out, std::filesystem::perms::all);
  // Root reads any file: the run is nobody's there.
  const bool root = geteuid() == 0;
  if (root && std::system("setpriv --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no setpriv";
  const testing::Outcome run =
      testing::RunDtrain(absl::StrCat("train ", SmallRecipe(), " --set run.out_dir=", out,
                                      " --set data.train=[", data, "]"),
                         root ? "setpriv --reuid=nobody --regid=nogroup --clear-groups" : "");
  EXPECT_EQ(run.exit_code, kExitUsage) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("opening data file " + data + ": Permission denied"));
}

// logging.metrics_file in folders of its own gets them, as train.export_to does; one that cannot
// be written says why.
TEST(TrainTest, AMetricsFileInFoldersGetsThemOrSaysWhyNot) {
  ASSERT_EQ(
      Train(RunDir("metrics_sub"), "--set train.steps=2 --set logging.metrics_file=sub/dir/m.jsonl")
          .exit_code,
      0);
  EXPECT_TRUE(std::filesystem::exists(RunDir("metrics_sub") + "/small/sub/dir/m.jsonl"));
  const std::string file = testing::WriteTempFile("metrics_in_the_way", "x");
  const testing::Outcome blocked =
      Train(RunDir("metrics_blocked"),
            "--set train.steps=2 --set logging.metrics_file=" + file + "/m.jsonl");
  EXPECT_EQ(blocked.exit_code, kExitUsage) << blocked.stderr_text;
  EXPECT_THAT(blocked.stderr_text, HasSubstr("cannot create the folder of " + file + "/m.jsonl: "));
  EXPECT_THAT(blocked.stderr_text, HasSubstr("set logging.metrics_file"));
}

// SFT end to end: `data pack --sft` writes masked shards that `train` with data.format sft packs,
// counts and learns (the answers are a function of the questions, so the loss falls).
TEST(TrainTest, SftShardsPackAndTrainOnTheAnswers) {
  std::string lines;
  for (int i = 0; i < 300; ++i) {
    absl::StrAppend(&lines, R"({"messages": [{"role": "user", "content": "What is )", i % 10,
                    R"( plus one?"}, {"role": "assistant", "content": "It is )", i % 10 + 1,
                    R"(."}]})", "\n");
  }
  const std::string chat = testing::WriteTempFile("chat.jsonl", lines);
  const std::string shards = testing::TempPath("sft_shards");
  std::filesystem::remove_all(shards);
  const testing::Outcome packed = testing::RunDtrain(
      absl::StrCat("data pack --sft --chat-template chatml ", chat, " --out ", shards));
  ASSERT_EQ(packed.exit_code, 0) << packed.stderr_text;
  EXPECT_THAT(packed.stdout_text, HasSubstr("300 documents"));
  // Bytes have no special tokens: ChatML's markers are text here, and the pack says so.
  EXPECT_THAT(packed.stderr_text, HasSubstr("warning: tokenizer bytes has no special token "
                                            "<|im_start|>, which the chatml template writes"));

  const std::string run_dir = RunDir("sft");
  std::filesystem::remove_all(run_dir);
  const std::string recipe =
      testing::WriteTempFile("sft.yaml", absl::StrCat(R"(
run: {name: sft, seed: 3}
model: {n_layer: 2, n_head: 2, d_model: 64, max_seq_len: 192}
data: {format: sft, train: [")",
                                                      shards, R"(/shard-*.tar"], val_fraction: 0.1}
train: {steps: 30, batch_size: 8, micro_batch: 4, seq_len: 192, lr: 3.0e-3, min_lr: 3.0e-4,
        warmup_steps: 2, eval_every: 15, eval_batches: 2}
logging: {sample_tokens: 0}
)"));
  const testing::Outcome trained =
      testing::RunDtrain(absl::StrCat("train ", recipe, " --set run.out_dir=", run_dir));
  ASSERT_EQ(trained.exit_code, 0) << trained.stderr_text;
  EXPECT_THAT(trained.stderr_text,
              HasSubstr("data.train: 300 SFT samples in 150 sequences of 192 (packed"));
  const auto steps = ReadMetrics(run_dir + "/sft");
  ASSERT_EQ(steps.size(), 30u);
  EXPECT_LT(steps.back()["loss"].get<double>(), 0.5 * steps.front()["loss"].get<double>());

  // The same shards read as pretraining data are refused (their masks were ignored, and every
  // token trained, prompts included), under data.on_error skip_shard too (no shard is bad).
  for (const std::string on_error : {"fail", "skip_shard"}) {
    const testing::Outcome unmasked = testing::RunDtrain(absl::StrCat(
        "train ", recipe, " --set run.out_dir=", run_dir, "_unmasked --set data.format=webdataset",
        " --set data.train=[] --set data.val_fraction=0 --set train.eval_every=0",
        " --set data.on_error=", on_error, " --set data.shards=", shards, "/shard-000000.tar"));
    EXPECT_EQ(unmasked.exit_code, kExitUsage) << unmasked.stderr_text;
    EXPECT_THAT(unmasked.stderr_text,
                HasSubstr("shard-000000.tar holds SFT samples (sample '000000000' has a .mask, "
                          "the tokens its loss counts, from `dtrain data pack --sft`), which "
                          "data.format webdataset would train on whole, prompts included: train "
                          "them with data.format: sft"));
  }

  // Bad input: an unknown template is a usage error; a bad line names its file and line.
  const testing::Outcome unknown = testing::RunDtrain(
      absl::StrCat("data pack --sft --chat-template llama9 ", chat, " --out ", shards));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.stderr_text, HasSubstr("chat template 'llama9' is neither"));
  const std::string bad = testing::WriteTempFile(
      "bad_chat.jsonl", absl::StrCat(R"({"prompt": "a", "completion": "b"})", "\n",
                                     R"({"prompt": "a", "completion": null})", "\n"));
  const testing::Outcome bad_line = testing::RunDtrain(
      absl::StrCat("data pack --sft ", bad, " --out ", testing::FreshTempDir("sft_bad_shards")));
  EXPECT_EQ(bad_line.exit_code, 2);
  EXPECT_THAT(bad_line.stderr_text, HasSubstr(bad + ":2: no \"completion\" string"));
}

// `dtrain ckpt export --format hf` of an SFT run's checkpoint ships the run's tokenizer
// (data.tokenizer) and renders chats as its shards were packed, as train.export_to's folder does:
// the chat template they record becomes the tokenizer's chat_template, and its end of turn a stop
// of generation_config.json. The run names its tokenizer and shards relative to its working
// folder, and the export runs from another: the manifest says where they were relative to.
TEST(TrainTest, CheckpointExportOfAnSftRunWritesItsTokenizerAndChatTemplate) {
  const std::string tokenizer = testing::FreshTempDir("sft_export_tokenizer");
  std::filesystem::create_directories(tokenizer);
  std::ofstream(tokenizer + "/tokenizer.json")
      << testing::TokenizerJson({{"t", "h"}}, {"<|im_start|>", "<|im_end|>", "<|endoftext|>"})
             .dump();
  std::string lines;
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&lines, R"({"prompt": "what is )", i, R"(", "completion": "it is )", i, R"("})",
                    "\n");
  }
  const std::string shards = testing::FreshTempDir("sft_export_shards");
  const testing::Outcome packed = testing::RunDtrain(
      absl::StrCat("data pack --sft --chat-template chatml --tokenizer ", tokenizer, " ",
                   testing::WriteTempFile("sft_export.jsonl", lines), " --out ", shards));
  ASSERT_EQ(packed.exit_code, 0) << packed.stderr_text;
  const std::string run_dir = RunDir("sft_export");
  std::filesystem::remove_all(run_dir);
  const std::filesystem::path work = std::filesystem::path(tokenizer).parent_path();
  const std::string relative_tokenizer = std::filesystem::path(tokenizer).filename().string();
  const std::string recipe = testing::WriteTempFile(
      "sft_export.yaml",
      absl::StrCat("run: {name: sft}\nmodel: {n_layer: 1, n_head: 2, d_model: 32, vocab_size: "
                   "300, max_seq_len: 64}\ndata: {format: sft, tokenizer: ",
                   relative_tokenizer, ", train: [\"",
                   std::filesystem::path(shards).filename().string(),
                   "/shard-*.tar\"], val_fraction: 0.1}\n",
                   "train: {steps: 2, batch_size: 2, micro_batch: 2, seq_len: 64, warmup_steps: "
                   "0, eval_every: 0, export_to: \"\"}\nlogging: {sample_tokens: 0}\n"));
  const testing::Outcome trained =
      testing::RunDtrain(absl::StrCat("train ", recipe, " --set run.out_dir=", run_dir),
                         "cd " + work.string() + " &&");
  ASSERT_EQ(trained.exit_code, 0) << trained.stderr_text;

  const std::string folder = testing::FreshTempDir("sft_export_folder");
  const std::string checkpoints = run_dir + "/sft/checkpoints";
  const testing::Outcome exported =
      testing::RunDtrain(absl::StrCat("ckpt export ", checkpoints, " --format hf --out ", folder));
  ASSERT_EQ(exported.exit_code, 0) << exported.stderr_text;
  EXPECT_TRUE(std::filesystem::exists(folder + "/tokenizer.json"));
  const nlohmann::json config =
      nlohmann::json::parse(std::ifstream(folder + "/tokenizer_config.json"), nullptr, false);
  EXPECT_THAT(config.value("chat_template", ""), HasSubstr("<|im_start|>"));
  const nlohmann::json generation =
      nlohmann::json::parse(std::ifstream(folder + "/generation_config.json"), nullptr, false);
  EXPECT_THAT(generation["eos_token_id"].dump(), HasSubstr("258"));  // <|im_end|>

  // Shards that no longer read from here: with --tokenizer, an error that says so, not a folder
  // without the template; the run's own tokenizer comes without it, saying so.
  std::filesystem::remove_all(shards);
  const testing::Outcome gone = testing::RunDtrain(absl::StrCat(
      "ckpt export ", checkpoints, " --format hf --out ", folder, "_gone --tokenizer ", tokenizer));
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_THAT(gone.stderr_text, HasSubstr("the checkpoint's run trained on SFT shards"));
  const testing::Outcome untemplated = testing::RunDtrain(
      absl::StrCat("ckpt export ", checkpoints, " --format hf --out ", folder, "_untemplated"));
  ASSERT_EQ(untemplated.exit_code, 0) << untemplated.stderr_text;
  EXPECT_THAT(untemplated.stderr_text, HasSubstr("the folder's tokenizer has no chat template"));
  EXPECT_TRUE(std::filesystem::exists(folder + "_untemplated/tokenizer.json"));

  // --tokenizer none: the weights alone.
  const testing::Outcome bare = testing::RunDtrain(absl::StrCat(
      "ckpt export ", checkpoints, " --format hf --out ", folder, "_bare --tokenizer none"));
  ASSERT_EQ(bare.exit_code, 0) << bare.stderr_text;
  EXPECT_TRUE(std::filesystem::exists(folder + "_bare/config.json"));
  EXPECT_FALSE(std::filesystem::exists(folder + "_bare/tokenizer.json"));

  // A run's tokenizer that is not here: left out, saying so and how to ship one.
  std::filesystem::remove_all(tokenizer);
  const testing::Outcome moved = testing::RunDtrain(
      absl::StrCat("ckpt export ", checkpoints, " --format hf --out ", folder, "_moved"));
  EXPECT_EQ(moved.exit_code, 0) << moved.stderr_text;
  EXPECT_THAT(moved.stderr_text, AllOf(HasSubstr("/" + relative_tokenizer + ", which is not here"),
                                       HasSubstr("give --tokenizer PATH")));
  EXPECT_TRUE(std::filesystem::exists(folder + "_moved/config.json"));
  EXPECT_FALSE(std::filesystem::exists(folder + "_moved/tokenizer.json"));

  // A checkpoint from another machine, whose working folder is not on this one: the tokenizer's
  // relative path is looked for from here, and the warning names both folders.
  const std::string manifest_path = checkpoints + "/step-2/manifest.json";
  absl::StatusOr<Manifest> manifest =
      ManifestFromJson(ReadWholeFile(manifest_path).value(), manifest_path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  manifest->working_dir = "/elsewhere/project";
  ASSERT_TRUE(WriteFileDurably(manifest_path, ManifestToJson(*manifest)).ok());
  const testing::Outcome elsewhere = testing::RunDtrain(
      absl::StrCat("ckpt export ", checkpoints, " --format hf --out ", folder, "_elsewhere"));
  EXPECT_EQ(elsewhere.exit_code, 0) << elsewhere.stderr_text;
  EXPECT_THAT(elsewhere.stderr_text,
              HasSubstr(absl::StrCat("data.tokenizer ", relative_tokenizer,
                                     ", which is not here (looked for under ",
                                     std::filesystem::current_path().string(),
                                     "; the run's working folder /elsewhere/project is not on "
                                     "this machine)")));
}

}  // namespace
}  // namespace dtrain
