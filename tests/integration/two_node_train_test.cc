// `dtrain train` as two ranks on two "nodes" (tests/testing/two_node_netns.h), each started as
// srun starts a task: with the job's token they meet in rank 0's store, each finding by itself the
// address the other reaches its Gloo device at (this host's name resolves to 127.0.0.1, which the
// other node cannot reach), or taking GLOO_SOCKET_IFNAME's; without a token both stop at once,
// saying what to set. Needs root and `ip netns`; skipped otherwise.
#include <chrono>
#include <filesystem>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/free_port.h"
#include "tests/testing/run_dtrain.h"
#include "tests/testing/two_node_netns.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using testing::kNamespace;
using testing::kNodeZeroAddress;
using testing::RunShell;
using testing::ShellRun;

class TwoNodeTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::CanMakeNamespaces()) GTEST_SKIP() << "needs root and ip netns";
    ASSERT_TRUE(node_.ok()) << "could not set up the network namespace " << kNamespace;
    out_dir_ = testing::FreshTempDir("two_node_train");
    std::string text;
    for (int i = 0; i < 200; ++i)
      absl::StrAppend(&text, "Pack my box with five dozen jugs ", i, ".\n");
    const std::string data = testing::WriteTempFile("two_node_text.txt", text);
    recipe_ = testing::WriteTempFile("two_node_recipe.yaml", absl::StrCat(R"(
run: {name: two, seed: 5, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [)",
                                                                          data, R"(]}
train: {steps: 3, batch_size: 4, micro_batch: 2, seq_len: 16, warmup_steps: 1, eval_every: 0,
        export_to: ""}
parallel: {timeout_s: 10}
logging: {sample_tokens: 0}
)"));
    port_ = testing::FreeTcpPort();
  }

  // Rank `rank` of 2 as srun would start it, node 1 inside the namespace; `env` is added, and
  // `sets` after the recipe; `wrapper` (a command that runs its arguments) goes before.
  std::string Command(int rank, const std::string& env, const std::string& sets = "",
                      const std::string& wrapper = "") const {
    const std::string train = absl::StrCat(
        wrapper, "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DTRAIN_RANK=", rank,
        " DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0 DTRAIN_LOCAL_WORLD_SIZE=1 DTRAIN_NODE_RANK=",
        rank, " DTRAIN_NUM_NODES=2 DTRAIN_MASTER_ADDR=", kNodeZeroAddress,
        " DTRAIN_MASTER_PORT=", port_, " ", env, " timeout 120 ", DTRAIN_BINARY, " train ", recipe_,
        " --set run.out_dir=", out_dir_, " ", sets);
    if (rank == 0) return train;
    return absl::StrCat("ip netns exec ", kNamespace, " ", train);
  }

  std::pair<ShellRun, ShellRun> RunBoth(const std::string& env_zero, const std::string& env_one) {
    std::future<ShellRun> one = std::async(std::launch::async, RunShell, Command(1, env_one));
    ShellRun zero = RunShell(Command(0, env_zero));
    return {zero, one.get()};
  }

  testing::MachineLock lock_;  // before node_: held from before it is made until it is removed
  testing::SecondNode node_;
  std::string out_dir_, recipe_;
  int port_ = 0;
};

TEST_F(TwoNodeTrainTest, RanksOnTwoNodesTrainWithTheJobsToken) {
  const std::string token = "DTRAIN_RDZV_TOKEN=two-node-test";
  const auto [zero, one] = RunBoth(token, token);
  ASSERT_EQ(zero.exit_code, 0) << zero.output << "\nrank 1:\n" << one.output;
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(zero.output, HasSubstr("step 3/3"));
  EXPECT_EQ(testing::MetricsLosses(out_dir_ + "/two/metrics.jsonl").size(), 3u);
}

TEST_F(TwoNodeTrainTest, GlooSocketIfnameNamesTheInterface) {
  const auto [zero, one] = RunBoth("DTRAIN_RDZV_TOKEN=t GLOO_SOCKET_IFNAME=dtrain-dr0",
                                   "DTRAIN_RDZV_TOKEN=t GLOO_SOCKET_IFNAME=dtrain-dr1");
  ASSERT_EQ(zero.exit_code, 0) << zero.output << "\nrank 1:\n" << one.output;
  ASSERT_EQ(one.exit_code, 0) << one.output;

  const auto [missing, other] = RunBoth("DTRAIN_RDZV_TOKEN=t GLOO_SOCKET_IFNAME=nosuch0",
                                        "DTRAIN_RDZV_TOKEN=t GLOO_SOCKET_IFNAME=dtrain-dr1");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output,
              HasSubstr("GLOO_SOCKET_IFNAME: network interface 'nosuch0' has no address here"));
  EXPECT_NE(other.exit_code, 0) << other.output;
}

// Node 1 cut off mid-run: its rank ends within parallel.timeout_s (10 s) and the time its
// failure report takes to fail, where a request to the store waited the client's own 60 s for
// its reply. Bounded at 45 s; `timeout 120` ends a rank that would hang.
TEST_F(TwoNodeTrainTest, ARankCutOffFromTheOthersEndsWithinTheTimeout) {
  const std::string token = "DTRAIN_RDZV_TOKEN=t", sets = "--set train.steps=100000";
  std::future<ShellRun> zero = std::async(std::launch::async, RunShell, Command(0, token, sets));
  std::future<ShellRun> one = std::async(std::launch::async, RunShell, Command(1, token, sets));
  const std::string metrics = out_dir_ + "/two/metrics.jsonl";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && testing::MetricsLosses(metrics).size() < 2) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(testing::MetricsLosses(metrics).size(), 2u) << zero.get().output;
  ASSERT_TRUE(node_.CutOff());
  const bool ended = one.wait_for(std::chrono::seconds(45)) == std::future_status::ready;
  const ShellRun cut_off = one.get();
  EXPECT_TRUE(ended) << "rank 1 ran on 45 s after it was cut off:\n" << cut_off.output;
  EXPECT_EQ(cut_off.exit_code, 1) << cut_off.output;
  EXPECT_NE(zero.get().exit_code, 0);
}

// MASTER_ADDR a host name that rank 0's host maps to 127.0.1.1 (Debian's line for the host's own
// name) and node 1 to node 0's address: rank 0's store listens on every interface, so node 1
// reaches it (listening at 127.0.1.1 only, it refused node 1 until the timeout). Each rank sees
// its own /etc/hosts, bound over the file in a mount namespace of its own.
TEST_F(TwoNodeTrainTest, AMasterNameThatRankZerosHostMapsToLoopbackStillJoins) {
  const auto hosts = [](int rank, const std::string& address) {
    return absl::StrCat(
        "unshare -m sh -c 'mount --bind ",
        testing::WriteTempFile(absl::StrCat("hosts_", rank),
                               absl::StrCat("127.0.0.1 localhost\n", address, " dtrain-master\n")),
        " /etc/hosts && exec \"$0\" \"$@\"' ");
  };
  const std::string env = "DTRAIN_RDZV_TOKEN=t DTRAIN_MASTER_ADDR=dtrain-master";
  std::future<ShellRun> one =
      std::async(std::launch::async, RunShell, Command(1, env, "", hosts(1, kNodeZeroAddress)));
  const ShellRun zero = RunShell(Command(0, env, "", hosts(0, "127.0.1.1")));
  const ShellRun node_one = one.get();
  ASSERT_EQ(zero.exit_code, 0) << zero.output << "\nrank 1:\n" << node_one.output;
  ASSERT_EQ(node_one.exit_code, 0) << node_one.output;
  EXPECT_EQ(testing::MetricsLosses(out_dir_ + "/two/metrics.jsonl").size(), 3u);
}

TEST_F(TwoNodeTrainTest, WithoutATokenBothRanksStopAtOnce) {
  const auto [zero, one] = RunBoth("", "");
  for (const ShellRun& rank : {zero, one}) {
    EXPECT_EQ(rank.exit_code, 2) << rank.output;
    EXPECT_THAT(rank.output, HasSubstr("this world spans 2 nodes"));
    EXPECT_THAT(rank.output, HasSubstr("export DTRAIN_RDZV_TOKEN"));
  }
}

// Ranks that claim one node, so that no token is asked for: rank 0's store admits only clients
// on its own host and refuses the rank of the other, which says why.
TEST_F(TwoNodeTrainTest, AStoreWithoutATokenRefusesAnotherHostsRank) {
  const std::string one_node = "DTRAIN_NUM_NODES=1 DTRAIN_LOCAL_WORLD_SIZE=2 DTRAIN_NODE_RANK=0";
  const auto [zero, one] = RunBoth(one_node, one_node + " DTRAIN_LOCAL_RANK=1");
  EXPECT_NE(one.exit_code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("the job has no DTRAIN_RDZV_TOKEN, so only clients on the "
                                    "store's own host are accepted"));
  EXPECT_THAT(zero.output, HasSubstr("rendezvous store: refused client 10.213.9.2:"));
}

}  // namespace
}  // namespace dtrain
