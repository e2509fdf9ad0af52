#include "launch/doctor/cluster.h"

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/configs.h"
#include "tests/testing/free_port.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain::doctor {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMs = 1'000'000;  // nanoseconds

TEST(ClusterDoctorTest, ClockOffsetComesFromTheShortestRoundTrip) {
  // Node 0's clock is 250 ms ahead. The first answer took 30 ms out and 2 ms back (an asymmetric
  // delay the midpoint cannot see); the second 1 ms each way, so its midpoint is exact.
  const int64_t ahead = 250 * kMs;
  const std::vector<ClockSample> samples = {
      {1000 * kMs, 1000 * kMs + 30 * kMs + ahead, 1000 * kMs + 32 * kMs},
      {2000 * kMs, 2000 * kMs + 1 * kMs + ahead, 2000 * kMs + 2 * kMs},
  };
  const ClockOffset offset = EstimateClockOffset(samples);
  EXPECT_EQ(offset.offset_ns, ahead);
  EXPECT_EQ(offset.uncertainty_ns, 1 * kMs);
  // The asymmetric sample alone is off by half its asymmetry (14 ms), within its uncertainty.
  const ClockOffset rough = EstimateClockOffset({samples[0]});
  EXPECT_EQ(rough.offset_ns, ahead + 14 * kMs);
  EXPECT_EQ(rough.uncertainty_ns, 16 * kMs);
}

TEST(ClusterDoctorTest, SkewOverTheThresholdNamesTheNode) {
  const CheckResult close = ClockSkewCheck("n2", "n1", {3 * kMs, kMs});
  EXPECT_EQ(close.verdict, Verdict::kOk);
  EXPECT_THAT(close.detail, HasSubstr("n2's clock is 3.0 ms behind n1's"));

  const CheckResult ahead = ClockSkewCheck("n2", "n1", {-1500 * kMs, kMs});
  EXPECT_EQ(ahead.verdict, Verdict::kWarn);
  EXPECT_THAT(ahead.detail, HasSubstr("n2's clock is 1500.0 ms ahead of n1's"));
  EXPECT_THAT(ahead.fix, HasSubstr("chrony"));
  EXPECT_THAT(ahead.fix, HasSubstr("n2"));

  // 120 ms measured with +/- 30 ms could be 90 ms: not proof of a skew over 100 ms.
  EXPECT_EQ(ClockSkewCheck("n2", "n1", {120 * kMs, 30 * kMs}).verdict, Verdict::kOk);
  EXPECT_EQ(ClockSkewCheck("n2", "n1", {120 * kMs, 10 * kMs}).verdict, Verdict::kWarn);
}

TEST(ClusterDoctorTest, BandwidthIsJudgedAgainstTheDeclaredNetwork) {
  const ClusterSpec ethernet = testing::CatalogCluster(2, "h100-sxm", "eth-25");  // 2.5 GB/s
  const CheckResult fine = BandwidthCheck(2.0, 64 << 20, 2, &ethernet);
  EXPECT_EQ(fine.verdict, Verdict::kOk);
  EXPECT_THAT(fine.detail, HasSubstr("bus bandwidth 2.00 GB/s, 80% of cluster.network eth-25"));

  const CheckResult slow = BandwidthCheck(0.5, 64 << 20, 2, &ethernet);
  EXPECT_EQ(slow.verdict, Verdict::kWarn);
  EXPECT_THAT(slow.fix, HasSubstr("cluster.network"));

  // Gloo's TCP path is not NCCL's RDMA one: a shortfall there is information.
  const ClusterSpec infiniband = testing::CatalogCluster(2, "h100-sxm", "ib-ndr");
  EXPECT_EQ(BandwidthCheck(0.5, 64 << 20, 2, &infiniband).verdict, Verdict::kInfo);
  EXPECT_EQ(BandwidthCheck(0.5, 64 << 20, 2, nullptr).verdict, Verdict::kInfo);
}

TEST(ClusterDoctorTest, NodeCountIsCheckedAgainstTheRecipe) {
  const ClusterSpec one = testing::CatalogCluster(1, "h100-sxm", "eth-25");
  const CheckResult more = NodeCountCheck(2, &one);
  EXPECT_EQ(more.verdict, Verdict::kWarn);
  EXPECT_THAT(more.fix, HasSubstr("set cluster.nodes to 2,"));
  EXPECT_EQ(NodeCountCheck(1, &one).verdict, Verdict::kOk);
  EXPECT_EQ(NodeCountCheck(2, nullptr).verdict, Verdict::kInfo);
}

TEST(ClusterDoctorTest, NodeVerdictIsItsWorstCheck) {
  const std::vector<NodeReport> nodes = {
      {0, "n1", {{"a", Verdict::kOk, "fine", ""}, {"b", Verdict::kInfo, "no GPU", ""}}},
      {1, "n2", {{"a", Verdict::kWarn, "slow", "fix it"}, {"c", Verdict::kFail, "gone", "x"}}},
  };
  EXPECT_EQ(WorstVerdict(nodes[0].results), Verdict::kOk);
  EXPECT_EQ(WorstVerdict(nodes[1].results), Verdict::kFail);
  const std::string text = ClusterSummaryText(nodes, {{"cluster.allreduce", Verdict::kOk, "", ""}});
  EXPECT_THAT(text, HasSubstr("== n2 (rank 1)\n"));
  EXPECT_THAT(text, HasSubstr("== verdict per node\nok    n1 (rank 0)\nfail  n2 (rank 1)\n"));
  EXPECT_THAT(text, HasSubstr("2 ok, 1 info, 1 warn, 1 fail\n"));
  const nlohmann::ordered_json json = ClusterSummaryJson(nodes, {});
  EXPECT_EQ(json["nodes"][1]["verdict"], "fail");
}

TEST(ClusterDoctorTest, MissingRankIsNamedBySlurmsNodeList) {
  const EnvironmentMap env = {{"SLURM_STEP_NODELIST", "n[1-3]"},
                              {"SLURM_STEP_TASKS_PER_NODE", "2,1(x2)"}};
  EXPECT_EQ(ExpectedNodeName(env, 1), "n1");
  EXPECT_EQ(ExpectedNodeName(env, 2), "n2");
  EXPECT_EQ(ExpectedNodeName(env, 3), "n3");
  EXPECT_EQ(ExpectedNodeName(env, 4), "");
  EXPECT_EQ(ExpectedNodeName({}, 1), "");
  EnvironmentMap cyclic = env;
  cyclic["SLURM_DISTRIBUTION"] = "cyclic";  // rank 1 is on n2 there: no guess
  EXPECT_EQ(ExpectedNodeName(cyclic, 1), "");
  cyclic["SLURM_DISTRIBUTION"] = "block:cyclic";  // blocks over nodes, cyclic over sockets
  EXPECT_EQ(ExpectedNodeName(cyclic, 1), "n1");
}

ClusterDoctorOptions LoopbackOptions(int rank, int world_size, int port) {
  ClusterDoctorOptions options;
  options.env = {{"SLURMD_NODENAME", absl::StrCat("n", rank + 1)}};
  options.world.rank = rank;
  options.world.world_size = world_size;
  options.world.num_nodes = world_size;
  options.world.master_addr = "127.0.0.1";
  options.world.master_port = port;
  options.timeout = absl::Seconds(30);
  options.bandwidth_bytes = 1 << 20;
  options.clock_samples = 3;
  return options;
}

TEST(ClusterDoctorTest, TwoNodesMeetAndNodeZeroSummarises) {
  const std::string dir = testing::FreshTempDir("doctor_cluster_ckpt");
  std::filesystem::create_directories(dir);
  const ClusterSpec cluster = testing::CatalogCluster(2, "h100-sxm", "eth-25");
  const int port = testing::FreeTcpPort();
  ClusterDoctorOutcome outcomes[2];
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      ClusterDoctorOptions options = LoopbackOptions(rank, 2, port);
      options.checkpoint_dir = dir + "/ckpt";
      options.cluster = &cluster;
      outcomes[rank] = RunClusterChecks(options, {{"node.shm", Verdict::kOk, "big", ""}});
    });
  }
  for (std::thread& rank : ranks) rank.join();

  EXPECT_FALSE(outcomes[1].summary);
  EXPECT_TRUE(outcomes[1].in_summary);
  const ClusterDoctorOutcome& summary = outcomes[0];
  ASSERT_TRUE(summary.summary);
  ASSERT_EQ(summary.nodes.size(), 2u);
  const std::string text = ClusterSummaryText(summary.nodes, summary.cluster);
  EXPECT_FALSE(AnyFailed(summary.nodes[1].results)) << text;
  EXPECT_EQ(summary.nodes[1].node, "n2");
  std::vector<std::string> names;
  for (const CheckResult& result : summary.nodes[1].results) names.push_back(result.name);
  EXPECT_THAT(names, ::testing::ElementsAre("node.shm", "cluster.reach", "cluster.clock",
                                            "cluster.checkpoint_shared"))
      << text;
  EXPECT_THAT(text, HasSubstr(absl::StrCat(dir, " is node 0's folder here too")));
  ASSERT_EQ(summary.cluster.size(), 2u);
  EXPECT_EQ(summary.cluster[0].verdict, Verdict::kOk) << text;  // cluster.nodes is 2
  EXPECT_THAT(summary.cluster[1].detail, HasSubstr("all-reduce of 1 MiB over 2 nodes")) << text;
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // the nonce file is gone
}

TEST(ClusterDoctorTest, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  ClusterDoctorOptions options = LoopbackOptions(0, 2, testing::FreeTcpPort());
  options.env["SLURM_STEP_NODELIST"] = "n[1-2]";
  options.env["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  options.timeout = absl::Seconds(1);
  const ClusterDoctorOutcome outcome = RunClusterChecks(options, {});
  ASSERT_EQ(outcome.nodes.size(), 2u);
  EXPECT_EQ(outcome.nodes[1].node, "n2");
  ASSERT_EQ(outcome.nodes[1].results.size(), 1u);
  EXPECT_EQ(outcome.nodes[1].results[0].verdict, Verdict::kFail);
  EXPECT_THAT(outcome.nodes[1].results[0].detail,
              HasSubstr("n2 (rank 1) did not reach the master 127.0.0.1:"));
  EXPECT_THAT(outcome.nodes[1].results[0].fix, HasSubstr("nc -zv 127.0.0.1"));
  EXPECT_EQ(outcome.cluster.back().verdict, Verdict::kInfo);  // no all-reduce without every node
}

TEST(ClusterDoctorTest, NodeThatCannotReachTheMasterSaysSo) {
  ClusterDoctorOptions options = LoopbackOptions(1, 2, testing::FreeTcpPort());  // nobody serves
  options.timeout = absl::Seconds(1);
  const ClusterDoctorOutcome outcome = RunClusterChecks(options, {});
  EXPECT_FALSE(outcome.in_summary);
  ASSERT_EQ(outcome.nodes.size(), 1u);
  ASSERT_FALSE(outcome.nodes[0].results.empty());
  const CheckResult& reach = outcome.nodes[0].results.back();
  EXPECT_EQ(reach.name, "cluster.reach");
  EXPECT_EQ(reach.verdict, Verdict::kFail);
  EXPECT_THAT(reach.detail, HasSubstr("n2 (rank 1) cannot reach the master 127.0.0.1:"));
}

}  // namespace
}  // namespace dtrain::doctor
