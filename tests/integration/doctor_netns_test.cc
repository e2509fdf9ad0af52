// `dtrain doctor` across two "nodes": this host's network namespace (node 0, which hosts the
// store) and a second namespace joined to it by a veth pair. The doctor runs as two processes,
// as `srun dtrain doctor` would start them: with the link up node 0 summarises both nodes; with
// the second namespace's link down its node is named by node 0 and by itself, within the
// timeout; with a private folder mounted over the checkpoint folder on the second node, the
// shared-folder check names that node. Needs root and `ip netns`; skipped otherwise.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/free_port.h"
#include "tests/testing/run_dtrain.h"
#include "tests/testing/two_node_netns.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using testing::kNamespace;
using testing::kNodeOneAddress;
using testing::kNodeZeroAddress;
using testing::RunShell;
using testing::SecondNode;
using testing::ShellRun;

class DoctorNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::CanMakeNamespaces()) GTEST_SKIP() << "needs root and ip netns";
    ASSERT_TRUE(node_.ok()) << "could not set up the network namespace " << kNamespace;
    out_dir_ = testing::FreshTempDir("doctor_netns_out");
    std::filesystem::create_directories(out_dir_);
    port_ = testing::FreeTcpPort();
  }

  // `dtrain doctor` as rank `rank` of 2, node 1 inside the namespace; `before` runs first there.
  std::string Command(int rank, const std::string& before = "") const {
    const std::string env =
        absl::StrCat("env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURMD_NODENAME=node", rank,
                     " DTRAIN_RANK=", rank, " DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0",
                     " DTRAIN_LOCAL_WORLD_SIZE=1 DTRAIN_NODE_RANK=", rank,
                     " DTRAIN_NUM_NODES=2 DTRAIN_MASTER_ADDR=", kNodeZeroAddress,
                     " DTRAIN_MASTER_PORT=", port_, " DTRAIN_RDZV_TOKEN=doctor-netns-test");
    const std::string doctor =
        absl::StrCat(env, " ", DTRAIN_BINARY, " doctor ", DTRAIN_SOURCE_DIR,
                     "/configs/tiny.yaml --set ", "run.out_dir=", out_dir_, " --set data.train=[",
                     testing::WriteTempFile("doctor_netns_corpus.txt", "Some text."), "]",
                     " --timeout-s 5 --hostname ", rank == 0 ? kNodeZeroAddress : kNodeOneAddress);
    if (rank == 0) return doctor;
    return absl::StrCat("ip netns exec ", kNamespace, " sh -c '", before, doctor, "'");
  }

  // Both ranks at once; node 0's run and node 1's.
  std::pair<ShellRun, ShellRun> RunBoth(const std::string& node_one_before = "") {
    std::future<ShellRun> node_one =
        std::async(std::launch::async, RunShell, Command(1, node_one_before));
    ShellRun node_zero = RunShell(Command(0));
    return {node_zero, node_one.get()};
  }

  testing::MachineLock
      lock_;  // before node_: held from before it is made until after it is removed
  SecondNode node_;
  std::string out_dir_;
  int port_ = 0;
};

TEST_F(DoctorNetnsTest, NodeZeroSummarisesBothNodes) {
  const auto [zero, one] = RunBoth();
  // Both nodes pass every check that fails a node (the summary's own verdicts are below).
  EXPECT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(zero.output, HasSubstr("== node1 (rank 1)\n"));
  EXPECT_THAT(zero.output,
              ::testing::ContainsRegex("ok +cluster.reach +reached the master 10.213.9.1:"));
  EXPECT_THAT(zero.output,
              ::testing::ContainsRegex("ok +cluster.clock +node1 \\(rank 1\\)'s clock"));
  // The checkpoint folder does not exist yet: its nearest existing parent is checked.
  EXPECT_THAT(zero.output, HasSubstr(absl::StrCat(out_dir_, " is node 0's folder here too")));
  EXPECT_THAT(zero.output, HasSubstr("all-reduce of 64 MiB over 2 nodes (Gloo): bus bandwidth"));
  EXPECT_THAT(zero.output, HasSubstr("== verdict per node\n"));
  // Node 1 reached node 0, so the summary holds its report and it prints nothing of its own.
  EXPECT_EQ(one.output.find("== node1"), std::string::npos) << one.output;
}

TEST_F(DoctorNetnsTest, NodeThatCannotReachTheMasterIsNamedWithinTheTimeout) {
  ASSERT_TRUE(node_.CutOff());
  const auto start = std::chrono::steady_clock::now();
  const auto [zero, one] = RunBoth();
  // A safety cap, far above the 5 s timeout: the point is that neither side hangs.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  EXPECT_EQ(zero.exit_code, 1) << zero.output;
  EXPECT_THAT(
      zero.output,
      HasSubstr(absl::StrCat("rank 1 did not reach the master 10.213.9.1:", port_, " within 5s")));
  EXPECT_THAT(zero.output, HasSubstr(absl::StrCat("nc -zv 10.213.9.1 ", port_)));
  EXPECT_THAT(zero.output, ::testing::ContainsRegex("fail +rank 1\n"));
  EXPECT_EQ(one.exit_code, 1) << one.output;
  EXPECT_THAT(one.output,
              HasSubstr(absl::StrCat("node1 (rank 1) cannot reach the master 10.213.9.1:", port_)));
}

TEST_F(DoctorNetnsTest, CheckpointFolderThatIsNotSharedNamesTheNode) {
  // The namespace's process has its own mount namespace (ip netns exec): a tmpfs over the
  // folder there is that node's own folder, as a node-local disk would be.
  const auto [zero, one] = RunBoth(absl::StrCat("mount -t tmpfs none ", out_dir_, " && "));
  EXPECT_EQ(zero.exit_code, 1) << zero.output;
  EXPECT_THAT(zero.output, ::testing::ContainsRegex("fail +cluster.checkpoint_shared +node1 "
                                                    "\\(rank 1\\) does not see the file"));
  EXPECT_THAT(zero.output, HasSubstr("checkpoint.dir is not shared"));
  EXPECT_THAT(zero.output, ::testing::ContainsRegex("fail +node1 \\(rank 1\\)\n"));
}

}  // namespace
}  // namespace dtrain
