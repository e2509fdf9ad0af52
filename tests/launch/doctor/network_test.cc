#include "launch/doctor/network.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/configs.h"
#include "tests/testing/fake_sysfs.h"

namespace dtrain::doctor {
namespace {

using testing::EthernetNode;
using ::testing::HasSubstr;
using testing::InfinibandNode;
using testing::RoceNode;

const CheckResult* Find(const std::vector<CheckResult>& results, const std::string& name) {
  for (const CheckResult& result : results) {
    if (result.name == name) return &result;
  }
  return nullptr;
}

std::vector<std::string> Failed(const std::vector<CheckResult>& results) {
  std::vector<std::string> names;
  for (const CheckResult& result : results) {
    if (result.verdict == Verdict::kFail) names.push_back(result.name);
  }
  return names;
}

TEST(DoctorNetworkTest, ReadsInterfacesPortsAndTheGidTable) {
  const NetworkInventory network = ReadNetwork(RoceNode().root());
  ASSERT_EQ(network.interfaces.size(), 2u);  // loopback left out
  EXPECT_EQ(network.interfaces[1].name, "eth0");
  EXPECT_EQ(network.interfaces[1].speed_mbps, 1000);
  ASSERT_EQ(network.ports.size(), 1u);
  const RdmaPort& port = network.ports[0];
  EXPECT_EQ(port.label(), "mlx5_0:1");
  EXPECT_TRUE(port.active());
  EXPECT_TRUE(port.roce());
  EXPECT_EQ(port.gids.size(), 4u);  // the zero entry is no GID
  EXPECT_EQ(PreferredRoceGidIndex(port), 3);

  const NetworkInventory ethernet = ReadNetwork(EthernetNode().root());
  EXPECT_EQ(ethernet.interfaces.size(), 2u);
  EXPECT_EQ(ethernet.interfaces[0].speed_mbps, -1);  // docker0: no speed
  EXPECT_TRUE(ethernet.ports.empty());
}

// NCCL's list syntax: prefixes by default, = for exact names, ^ to exclude, :port for HCAs.
TEST(DoctorNetworkTest, NcclListsSelectAsNcclDoes) {
  EXPECT_TRUE(NcclListSelects("eth", "eth0", 0));
  EXPECT_FALSE(NcclListSelects("=eth", "eth0", 0));
  EXPECT_TRUE(NcclListSelects("=eth0", "eth0", 0));
  EXPECT_FALSE(NcclListSelects("^lo,docker0", "docker0", 0));
  EXPECT_TRUE(NcclListSelects("^lo,docker0", "eth0", 0));
  EXPECT_FALSE(NcclListSelects("^=eth0", "eth0", 0));
  EXPECT_TRUE(NcclListSelects("mlx5_0:1,mlx5_1:1", "mlx5_1", 1));
  EXPECT_FALSE(NcclListSelects("mlx5_0:1", "mlx5_0", 2));
  EXPECT_TRUE(NcclListSelects("mlx5", "mlx5_3", 1));
}

TEST(DoctorNetworkTest, InfinibandNodeIsHealthy) {
  const ClusterSpec cluster = testing::CatalogCluster(2, "h100-sxm", "ib-ndr");
  const std::vector<CheckResult> results = NetworkChecks(
      ReadNetwork(InfinibandNode().root()),
      {{"NCCL_IB_HCA", "=mlx5_0:1"}, {"NCCL_SOCKET_IFNAME", "^lo,docker0"}}, &cluster);
  EXPECT_EQ(Failed(results), std::vector<std::string>{});
  ASSERT_NE(Find(results, "rdma.mlx5_0:1"), nullptr);
  EXPECT_EQ(Find(results, "rdma.mlx5_0:1")->verdict, Verdict::kOk);
  EXPECT_THAT(Find(results, "rdma.mlx5_0:1")->detail, HasSubstr("400 Gb/sec (4X NDR)"));
  EXPECT_EQ(Find(results, "network.rdma")->verdict, Verdict::kOk);
  EXPECT_EQ(Find(results, "nccl.NCCL_IB_HCA")->verdict, Verdict::kOk);
  EXPECT_THAT(Find(results, "network.interfaces")->detail, HasSubstr("ib0 up 400 Gb/s"));
  // What dtrain plan prints for this network and nobody set is named with its export line.
  const CheckResult* timeout = Find(results, "nccl.NCCL_IB_TIMEOUT");
  ASSERT_NE(timeout, nullptr);
  EXPECT_EQ(timeout->verdict, Verdict::kWarn);
  EXPECT_THAT(timeout->fix, HasSubstr("export NCCL_IB_TIMEOUT=22"));

  // An HCA list naming no port of this node fails with the ports it has.
  const std::vector<CheckResult> wrong_hca =
      NetworkChecks(ReadNetwork(InfinibandNode().root()), {{"NCCL_IB_HCA", "=mlx4_0"}}, &cluster);
  EXPECT_EQ(Find(wrong_hca, "nccl.NCCL_IB_HCA")->verdict, Verdict::kFail);
  EXPECT_THAT(Find(wrong_hca, "nccl.NCCL_IB_HCA")->detail, HasSubstr("this node has mlx5_0:1"));
}

TEST(DoctorNetworkTest, RoceGidIndexMustNameTheIpv4RoceV2Gid) {
  const ClusterSpec cluster = testing::CatalogCluster(2, "h100-sxm", "roce-100");
  const NetworkInventory network = ReadNetwork(RoceNode().root());
  for (const char* wrong : {"0", "1", "2", "7"}) {
    const std::vector<CheckResult> results =
        NetworkChecks(network, {{"NCCL_IB_GID_INDEX", wrong}}, &cluster);
    EXPECT_EQ(Failed(results), (std::vector<std::string>{"nccl.NCCL_IB_GID_INDEX"})) << wrong;
    const CheckResult* gid = Find(results, "nccl.NCCL_IB_GID_INDEX");
    EXPECT_THAT(gid->fix, HasSubstr("export NCCL_IB_GID_INDEX=3")) << wrong;
    EXPECT_THAT(gid->detail, HasSubstr("of mlx5_0:1")) << wrong;
  }
  EXPECT_THAT(
      Find(NetworkChecks(network, {{"NCCL_IB_GID_INDEX", "0"}}, &cluster), "nccl.NCCL_IB_GID_INDEX")
          ->detail,
      HasSubstr("IB/RoCE v1"));
  const std::vector<CheckResult> right =
      NetworkChecks(network, {{"NCCL_IB_GID_INDEX", "3"}}, &cluster);
  EXPECT_EQ(Failed(right), std::vector<std::string>{});
  EXPECT_EQ(Find(right, "nccl.NCCL_IB_GID_INDEX")->verdict, Verdict::kOk);
  EXPECT_EQ(Find(right, "rdma.mlx5_0:1")->verdict, Verdict::kOk);
  EXPECT_THAT(Find(right, "rdma.mlx5_0:1")->detail, HasSubstr("RoCE v2 GID index 3"));
  // Unset on a RoCE recipe: a warning whose fix names this node's index, not plan's usual 3.
  const std::vector<CheckResult> unset = NetworkChecks(network, {}, &cluster);
  EXPECT_EQ(Find(unset, "nccl.NCCL_IB_GID_INDEX")->verdict, Verdict::kWarn);
  EXPECT_THAT(Find(unset, "nccl.NCCL_IB_GID_INDEX")->fix, HasSubstr("NCCL_IB_GID_INDEX=3"));
  // -1, NCCL's default spelled out, reads as unset (it failed as "not a GID index").
  const std::vector<CheckResult> automatic =
      NetworkChecks(network, {{"NCCL_IB_GID_INDEX", "-1"}}, &cluster);
  EXPECT_EQ(Find(automatic, "nccl.NCCL_IB_GID_INDEX")->verdict, Verdict::kWarn);
  EXPECT_THAT(Find(automatic, "nccl.NCCL_IB_GID_INDEX")->detail,
              HasSubstr("'-1' (NCCL's default)"));
  EXPECT_EQ(Find(NetworkChecks(ReadNetwork(EthernetNode().root()), {{"NCCL_IB_GID_INDEX", "-1"}},
                               &cluster),
                 "nccl.NCCL_IB_GID_INDEX")
                ->verdict,
            Verdict::kOk);
  // An InfiniBand recipe on this RoCE-only node has no port of its network.
  const ClusterSpec infiniband = testing::CatalogCluster(2, "h100-sxm", "ib-ndr");
  EXPECT_EQ(Failed(NetworkChecks(network, {}, &infiniband)),
            (std::vector<std::string>{"network.rdma"}));
}

TEST(DoctorNetworkTest, EthernetNodeIsInformationUnlessTheRecipeAsksForRdma) {
  const NetworkInventory network = ReadNetwork(EthernetNode().root());
  const std::vector<CheckResult> no_recipe = NetworkChecks(network, {}, nullptr);
  EXPECT_EQ(Failed(no_recipe), std::vector<std::string>{});
  EXPECT_EQ(Find(no_recipe, "network.rdma")->verdict, Verdict::kInfo);

  const ClusterSpec ethernet = testing::CatalogCluster(2, "h100-sxm", "eth-25");
  const std::vector<CheckResult> sockets = NetworkChecks(
      network, {{"NCCL_SOCKET_IFNAME", "=eth0"}, {"NCCL_IB_DISABLE", "1"}}, &ethernet);
  EXPECT_EQ(Failed(sockets), std::vector<std::string>{});
  EXPECT_EQ(Find(sockets, "network.rdma")->verdict, Verdict::kInfo);
  EXPECT_EQ(Find(sockets, "nccl.NCCL_SOCKET_IFNAME")->verdict, Verdict::kOk);
  // A one-node InfiniBand recipe does not use the network either.
  const ClusterSpec one_node = testing::CatalogCluster(1, "h100-sxm", "ib-ndr");
  EXPECT_EQ(Failed(NetworkChecks(network, {}, &one_node)), std::vector<std::string>{});

  const ClusterSpec infiniband = testing::CatalogCluster(2, "h100-sxm", "ib-ndr");
  const std::vector<CheckResult> rdma =
      NetworkChecks(network, {{"NCCL_IB_DISABLE", "1"}}, &infiniband);
  EXPECT_EQ(Failed(rdma), (std::vector<std::string>{"network.rdma", "nccl.NCCL_IB_DISABLE"}));
  EXPECT_THAT(Find(rdma, "network.rdma")->detail, HasSubstr("cluster.network ib-ndr"));
  EXPECT_THAT(Find(rdma, "network.rdma")->fix, HasSubstr("set cluster.network"));

  // NCCL_SOCKET_IFNAME naming an interface the node lacks, or only a down one.
  EXPECT_EQ(Find(NetworkChecks(network, {{"NCCL_SOCKET_IFNAME", "=ens1"}}, nullptr),
                 "nccl.NCCL_SOCKET_IFNAME")
                ->verdict,
            Verdict::kFail);
  EXPECT_THAT(Find(NetworkChecks(network, {{"NCCL_SOCKET_IFNAME", "docker"}}, nullptr),
                   "nccl.NCCL_SOCKET_IFNAME")
                  ->detail,
              HasSubstr("only interfaces that are down"));
  // GLOO_SOCKET_IFNAME, which training reads to bind: an interface the node lacks fails (the
  // first of a list, exactly), one it has passes.
  const std::vector<CheckResult> bogus =
      NetworkChecks(network, {{"GLOO_SOCKET_IFNAME", "bogus0,eth0"}}, nullptr);
  EXPECT_EQ(Find(bogus, "gloo.GLOO_SOCKET_IFNAME")->verdict, Verdict::kFail);
  EXPECT_THAT(Find(bogus, "gloo.GLOO_SOCKET_IFNAME")->detail,
              HasSubstr("'bogus0' is none of this node's interfaces"));
  EXPECT_EQ(Find(NetworkChecks(network, {{"GLOO_SOCKET_IFNAME", "eth0"}}, nullptr),
                 "gloo.GLOO_SOCKET_IFNAME")
                ->verdict,
            Verdict::kOk);
  EXPECT_EQ(Find(NetworkChecks(network, {{"NCCL_NET_GDR_LEVEL", "PCI"}}, nullptr),
                 "nccl.NCCL_NET_GDR_LEVEL")
                ->verdict,
            Verdict::kFail);
}

}  // namespace
}  // namespace dtrain::doctor
