#include "launch/doctor/doctor.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/configs.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain::doctor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A /proc with the driver's entries of `count` GPUs.
std::string ProcWithGpus(const std::string& name, int count) {
  const std::string root = testing::FreshTempDir(name);
  std::filesystem::create_directories(root);
  for (int i = 0; i < count; ++i) {
    std::filesystem::create_directories(std::filesystem::path(root) / "driver/nvidia/gpus" /
                                        ("0000:0" + std::to_string(i) + ":00.0"));
  }
  return root;
}

TEST(DoctorTest, MemlockMustBeUnlimitedForRdma) {
  EXPECT_EQ(MemlockCheck(std::nullopt, true, true).verdict, Verdict::kOk);
  const CheckResult bounded = MemlockCheck(64 * 1024, true, true);
  EXPECT_EQ(bounded.verdict, Verdict::kFail);
  EXPECT_THAT(bounded.detail, HasSubstr("ulimit -l is 64 KiB"));
  EXPECT_THAT(bounded.fix, HasSubstr("memlock unlimited"));
  EXPECT_EQ(MemlockCheck(64 * 1024, false, true).verdict, Verdict::kWarn);
  EXPECT_EQ(MemlockCheck(64 * 1024, false, false).verdict, Verdict::kInfo);
}

TEST(DoctorTest, ShmThatCannotBeReadIsNamed) {
  const CheckResult missing = ShmCheck(testing::TempPath("no_such_shm"));
  EXPECT_EQ(missing.verdict, Verdict::kWarn);
  EXPECT_THAT(missing.detail, HasSubstr("no_such_shm"));
  EXPECT_THAT(ShmCheck(::testing::TempDir()).detail, HasSubstr(" GiB"));
}

TEST(DoctorTest, GpusAreCountedAgainstTheRecipe) {
  GpuInventory none = FindGpus({}, ProcWithGpus("doctor_no_gpu", 0));
  const Recipe cpu = testing::ShippedRecipe("tiny");
  EXPECT_EQ(GpuCheck(none, nullptr).verdict, Verdict::kInfo);
  EXPECT_EQ(GpuCheck(none, &cpu).verdict, Verdict::kInfo);

  Recipe cuda = testing::ShippedRecipe("tiny", {"cluster.gpus_per_node=8", "run.device=cuda"});
  const CheckResult missing = GpuCheck(none, &cuda);
  EXPECT_EQ(missing.verdict, Verdict::kFail);
  EXPECT_THAT(missing.fix, HasSubstr("run.device: cpu"));

  const GpuInventory two = FindGpus({}, ProcWithGpus("doctor_two_gpus", 2));
  const CheckResult fewer = GpuCheck(two, &cuda);
  EXPECT_EQ(fewer.verdict, Verdict::kFail);
  EXPECT_THAT(fewer.fix, HasSubstr("set cluster.gpus_per_node to 2"));
  cuda.cluster.gpus_per_node = 2;
  EXPECT_EQ(GpuCheck(two, &cuda).verdict, Verdict::kOk);
  cuda.cluster.gpus_per_node = 1;
  EXPECT_EQ(GpuCheck(two, &cuda).verdict, Verdict::kWarn);

  // What counts is what CUDA_VISIBLE_DEVICES leaves (a Slurm job's share of an 8-GPU node): 2 of
  // 8 for a recipe of 2 is right, and 1 of them is too few (the installed 8 read as fine there).
  const std::string eight = ProcWithGpus("doctor_eight_gpus", 8);
  cuda.cluster.gpus_per_node = 2;
  EXPECT_EQ(GpuCheck(FindGpus({{"CUDA_VISIBLE_DEVICES", "0,1"}}, eight), &cuda).verdict,
            Verdict::kOk);
  const CheckResult narrowed = GpuCheck(FindGpus({{"CUDA_VISIBLE_DEVICES", "3"}}, eight), &cuda);
  EXPECT_EQ(narrowed.verdict, Verdict::kFail);
  EXPECT_THAT(narrowed.fix, HasSubstr("set cluster.gpus_per_node to 1"));
  const CheckResult hidden = GpuCheck(FindGpus({{"CUDA_VISIBLE_DEVICES", "-1"}}, eight), &cuda);
  EXPECT_EQ(hidden.verdict, Verdict::kFail);
  EXPECT_THAT(hidden.detail, HasSubstr("every GPU is hidden"));
}

TEST(DoctorTest, CheckpointFolderIsProbedAndLeftClean) {
  const std::string dir = testing::FreshTempDir("doctor_ckpt");
  std::filesystem::create_directories(dir);
  const CheckResult exists = CheckpointFolderCheck(dir);
  EXPECT_EQ(exists.verdict, Verdict::kOk);
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // the probe is gone

  const CheckResult later = CheckpointFolderCheck(dir + "/run/checkpoints");
  EXPECT_EQ(later.verdict, Verdict::kOk);
  EXPECT_THAT(later.detail, HasSubstr("does not exist yet"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));  // nothing created

  // Under a regular file no folder can be made (whoever runs the test, root included).
  std::ofstream(dir + "/file") << "x";
  const CheckResult blocked = CheckpointFolderCheck(dir + "/file/checkpoints");
  EXPECT_EQ(blocked.verdict, Verdict::kFail);
  EXPECT_THAT(blocked.detail, HasSubstr(dir + "/file is a file, not a folder"));
  EXPECT_THAT(blocked.fix, HasSubstr("checkpoint.dir"));

  // A name longer than the file system takes passed here, and training then refused it.
  const CheckResult long_name = CheckpointFolderCheck(dir + "/" + std::string(300, 'a') + "/ck");
  EXPECT_EQ(long_name.verdict, Verdict::kFail);
  EXPECT_THAT(long_name.detail, HasSubstr("is 300 bytes, more than the 255"));
  EXPECT_THAT(long_name.fix, HasSubstr("shorten checkpoint.dir"));
}

TEST(DoctorTest, MasterResolvesInAWorldOfMore) {
  EXPECT_EQ(MasterCheck({}).verdict, Verdict::kInfo);
  // A MASTER_ADDR without a rank or world size beside it is said to be unused (it was passed
  // over without a word, where the README says the doctor checks that the master resolves).
  const CheckResult alone = MasterCheck({{"MASTER_ADDR", "bogus.invalid"}});
  EXPECT_EQ(alone.verdict, Verdict::kInfo);
  EXPECT_THAT(alone.detail, HasSubstr("no master to reach; MASTER_ADDR=bogus.invalid is set and "
                                      "unused: no rank or world size is set beside it"));
  // torchrun's world of one sets its own beside its ranks: nothing to say.
  const CheckResult torchrun =
      MasterCheck({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}});
  EXPECT_EQ(torchrun.verdict, Verdict::kInfo);
  EXPECT_THAT(torchrun.detail, Not(HasSubstr("unused")));
  const EnvironmentMap local = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29510"}};
  const CheckResult ok = MasterCheck(local);
  EXPECT_EQ(ok.verdict, Verdict::kOk);
  EXPECT_THAT(ok.detail, HasSubstr("127.0.0.1:29510"));
  EnvironmentMap unknown = local;
  unknown["MASTER_ADDR"] = "no-such-host.invalid";
  const CheckResult missing = MasterCheck(unknown);
  EXPECT_EQ(missing.verdict, Verdict::kFail);
  EXPECT_THAT(missing.detail, HasSubstr("no-such-host.invalid"));
  EnvironmentMap no_master = local;
  no_master.erase("MASTER_ADDR");
  EXPECT_EQ(MasterCheck(no_master).verdict, Verdict::kFail);
}

TEST(DoctorTest, NodeChecksCoverTheNodeAndRejectAnUnknownNetwork) {
  DoctorOptions options;
  options.sys_root = testing::FreshTempDir("doctor_empty_sys");
  options.proc_root = ProcWithGpus("doctor_empty_proc", 0);
  options.memlock_bytes = std::optional<uint64_t>();
  const Recipe recipe =
      testing::ShippedRecipe("tiny", {"run.out_dir=" + testing::FreshTempDir("doctor_out")});
  options.recipe = &recipe;
  absl::StatusOr<std::vector<CheckResult>> results = RunNodeChecks(options);
  ASSERT_TRUE(results.ok()) << results.status();
  std::vector<std::string> names;
  for (const CheckResult& result : *results) names.push_back(result.name);
  // The Ethernet-less empty /sys has no RDMA port, so no rdma.* lines.
  EXPECT_EQ(names, (std::vector<std::string>{"network.interfaces", "network.rdma", "node.memlock",
                                             "node.shm", "node.gpus", "node.checkpoint_dir",
                                             "node.data", "launch.master"}));

  Recipe unknown = recipe;
  unknown.cluster.network = "token-ring";
  options.recipe = &unknown;
  const absl::StatusOr<std::vector<CheckResult>> rejected = RunNodeChecks(options);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(), HasSubstr("cluster.network"));
}

TEST(DoctorTest, ResultsPrintWithTheirFixAndCount) {
  const std::vector<CheckResult> results = {
      {"node.memlock", Verdict::kFail, "ulimit -l is 64 KiB", "raise it"},
      {"node.gpus", Verdict::kInfo, "0 GPUs", ""}};
  const std::string text = ResultsText(results);
  EXPECT_THAT(text, HasSubstr("fail  node.memlock  ulimit -l is 64 KiB\n      fix: raise it\n"));
  EXPECT_THAT(text, HasSubstr("0 ok, 1 info, 0 warn, 1 fail"));
  const nlohmann::ordered_json json = ResultsJson(results);
  EXPECT_EQ(json["checks"][0]["verdict"], "fail");
  EXPECT_EQ(json["checks"][1]["fix"], "");
  EXPECT_EQ(json["fail"], 1);
  EXPECT_TRUE(AnyFailed(results));
  EXPECT_FALSE(AnyFailed({results[1]}));
}

}  // namespace
}  // namespace dtrain::doctor
