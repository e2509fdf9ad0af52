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
