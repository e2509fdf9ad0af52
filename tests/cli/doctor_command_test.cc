// Runs `dtrain doctor` on fake /sys and /proc trees in a controlled environment (env -i, so the
// test machine's own NCCL and launcher variables do not leak in).
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_sysfs.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using testing::Outcome;

std::string EmptyProc() {
  const std::string proc = testing::FreshTempDir("doctor_cli_proc");
  std::filesystem::create_directories(proc);
  return proc;
}

TEST(DoctorCommandTest, EthernetNodeWithoutRecipeIsInformationNotFailure) {
  const testing::FakeSys sys = testing::EthernetNode();
  const Outcome outcome = testing::RunDtrain(
      absl::StrCat("doctor --sys-root ", sys.root(), " --proc-root ", EmptyProc()), "env -i");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.stdout_text << outcome.stderr_text;
  EXPECT_THAT(outcome.stdout_text, HasSubstr("info  network.rdma"));
  EXPECT_THAT(outcome.stdout_text, HasSubstr("no InfiniBand or RoCE device"));
  EXPECT_THAT(outcome.stdout_text, HasSubstr("eth0 up 25 Gb/s"));
  EXPECT_THAT(outcome.stdout_text, HasSubstr(" 0 fail\n"));
}

TEST(DoctorCommandTest, WrongRoceGidIndexFailsWithTheRightOne) {
  const testing::FakeSys sys = testing::RoceNode();
  const std::string args = absl::StrCat(
      "doctor ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set cluster.nodes=2 ",
      "--set cluster.network=roce-100 --set run.out_dir=", testing::FreshTempDir("doctor_cli_out"),
      " --json --sys-root ", sys.root(), " --proc-root ", EmptyProc());
  const Outcome outcome = testing::RunDtrain(args, "env -i NCCL_IB_GID_INDEX=0");
  ASSERT_EQ(outcome.exit_code, 1) << outcome.stdout_text << outcome.stderr_text;
  const nlohmann::json json = nlohmann::json::parse(outcome.stdout_text);
  bool found = false;
  for (const nlohmann::json& check : json["checks"]) {
    if (check["name"] != "nccl.NCCL_IB_GID_INDEX") continue;
    found = true;
    EXPECT_EQ(check["verdict"], "fail");
    EXPECT_THAT(check["fix"].get<std::string>(), HasSubstr("export NCCL_IB_GID_INDEX=3"));
  }
  EXPECT_TRUE(found) << outcome.stdout_text;
  EXPECT_GE(json["fail"].get<int>(), 1);
}

// The doctor's verdict and fix for the checkpoint folder on a file system in a mount namespace of
// its own: a 64 KiB tmpfs with mount options `options`, after the shell commands `then`.
nlohmann::json CheckpointFolderVerdict(const std::string& name, const std::string& options,
                                       const std::string& then) {
  const std::string dir = testing::FreshTempDir(name);
  const std::string prefix = testing::SmallFileSystemPrefix(dir, 64, options, then);
  if (prefix.empty()) return nullptr;
  const testing::FakeSys sys = testing::EthernetNode();
  const Outcome outcome = testing::RunDtrain(
      absl::StrCat("doctor ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml --set checkpoint.dir=", dir,
                   " --json --sys-root ", sys.root(), " --proc-root ", EmptyProc()),
      prefix + " env -i");
  const nlohmann::json json = nlohmann::json::parse(outcome.stdout_text);
  for (const nlohmann::json& check : json["checks"]) {
    if (check["name"] == "node.checkpoint_dir") return check;
  }
  ADD_FAILURE() << outcome.stdout_text << outcome.stderr_text;
  return nullptr;
}

// Each reason a checkpoint folder cannot take a checkpoint gets its own fix, and a folder whose
// file system has no byte free is no "ok" because an empty probe file fits.
TEST(DoctorCommandTest, ACheckpointFolderReadOnlyOrFullSaysWhatToDo) {
  const nlohmann::json read_only = CheckpointFolderVerdict("doctor_ro", ",ro", "true");
  if (read_only.is_null())
    GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  EXPECT_EQ(read_only["verdict"], "fail");
  EXPECT_THAT(read_only["fix"].get<std::string>(), HasSubstr("mounted read-only: remount it"));
  EXPECT_THAT(read_only["fix"].get<std::string>(), ::testing::Not(HasSubstr("chmod")));

  const nlohmann::json full =
      CheckpointFolderVerdict("doctor_full", "",
                              absl::StrCat("(cat /dev/zero >", testing::TempPath("doctor_full"),
                                           "/fill 2>/dev/null || true)"));
  EXPECT_EQ(full["verdict"], "warn");
  EXPECT_THAT(full["detail"].get<std::string>(), HasSubstr("0 bytes free"));
  EXPECT_THAT(full["fix"].get<std::string>(), HasSubstr("free space there"));
}

// The check of a node for a run: its data must be here (a run without it fails at start, on every
// restart), and GPUs it would leave idle under run.device cpu (the shipped GPU configs' default)
// are a warning.
TEST(DoctorCommandTest, TheRecipesDataAndDeviceAreChecked) {
  const testing::FakeSys sys = testing::EthernetNode();
  const std::string proc = EmptyProc();
  for (const char* gpu : {"0000:07:00.0", "0000:08:00.0"}) {
    std::filesystem::create_directories(absl::StrCat(proc, "/driver/nvidia/gpus/", gpu));
  }
  const auto check = [&](const std::string& sets, const std::string& name) {
    const Outcome outcome =
        testing::RunDtrain(absl::StrCat("doctor ", DTRAIN_SOURCE_DIR, "/configs/tiny.yaml ", sets,
                                        " --json --sys-root ", sys.root(), " --proc-root ", proc),
                           "env -i");
    const nlohmann::json json = nlohmann::json::parse(outcome.stdout_text);
    for (const nlohmann::json& result : json["checks"]) {
      if (result["name"] == name) return std::make_pair(outcome.exit_code, result);
    }
    ADD_FAILURE() << name << " missing: " << outcome.stdout_text << outcome.stderr_text;
    return std::make_pair(outcome.exit_code, nlohmann::json());
  };
  const std::string here =
      absl::StrCat("--set data.train=[",
                   testing::WriteTempFile("doctor_corpus.txt", "Some text to train on."), "]");
  const auto [missing_code, missing] = check("--set data.train=[/no/such/corpus.txt]", "node.data");
  EXPECT_EQ(missing_code, 1);
  EXPECT_EQ(missing["verdict"], "fail");
  EXPECT_THAT(missing["detail"].get<std::string>(),
              HasSubstr("file pattern '/no/such/corpus.txt' matches no file"));
  const nlohmann::json found = check(here, "node.data").second;
  EXPECT_EQ(found["verdict"], "ok") << found;
  const nlohmann::json cpu = check(here, "node.gpus").second;
  EXPECT_EQ(cpu["verdict"], "warn");
  EXPECT_THAT(cpu["detail"].get<std::string>(), HasSubstr("2 GPUs in "));
  EXPECT_EQ(cpu["fix"], "set run.device: cuda to train on them");
  const nlohmann::json cuda =
      check(here + " --set run.device=cuda --set cluster.gpus_per_node=2", "node.gpus").second;
  EXPECT_EQ(cuda["verdict"], "ok");
}

TEST(DoctorCommandTest, BadRecipeIsUsageError) {
  const std::string recipe = absl::StrCat(DTRAIN_SOURCE_DIR, "/configs/tiny.yaml");
  const Outcome unknown_network = testing::RunDtrain(
      absl::StrCat("doctor ", recipe, " --set cluster.network=token-ring"), "env -i");
  EXPECT_EQ(unknown_network.exit_code, 2);
  EXPECT_THAT(unknown_network.stderr_text, HasSubstr("cluster.network"));
  const Outcome missing = testing::RunDtrain("doctor no_such_recipe.yaml", "env -i");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.stderr_text, HasSubstr("no_such_recipe.yaml"));
}

}  // namespace
}  // namespace dtrain
