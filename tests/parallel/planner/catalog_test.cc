#include "parallel/planner/catalog.h"

#include <string>

#include "absl/status/statusor.h"
#include "core/recipe/recipe.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

TEST(CatalogTest, PublishedFigures) {
  EXPECT_EQ(FindGpu("a100-80gb")->peak_tflops, 312);
  EXPECT_EQ(FindGpu("a100-40gb")->peak_tflops, 312);
  EXPECT_EQ(FindGpu("h100-sxm")->peak_tflops, 989);
  EXPECT_EQ(FindGpu("h200")->peak_tflops, 989);
  EXPECT_GT(FindGpu("h200")->memory_gib, 2 * FindGpu("h100-sxm")->memory_gib * 0.85);
  EXPECT_EQ(FindLink("nvlink3")->busbw_gbps, 230);
  EXPECT_EQ(FindLink("nvlink4")->busbw_gbps, 370);
  EXPECT_EQ(FindLink("ib-hdr")->busbw_gbps, 24);
  EXPECT_GE(FindLink("ib-ndr")->busbw_gbps, 46);
  EXPECT_LE(FindLink("ib-ndr")->busbw_gbps, 49);
  EXPECT_EQ(FindLink("eth-100")->busbw_gbps, 12);
  EXPECT_EQ(FindGpu("b300"), nullptr);
  for (const GpuSpec& gpu : GpuCatalog()) {
    EXPECT_NE(FindLink(gpu.intra_link), nullptr) << gpu.name;
  }
}

// Without cluster.nics_per_node, an RDMA fabric has one adapter per GPU and a TCP network one
// per node (the interface the plan's NCCL_SOCKET_IFNAME names): 8 eth-100 NICs per node made
// Ethernet clusters look like rail-optimised InfiniBand ones.
TEST(CatalogTest, NicsPerNodeDefaultsToTheNetworksKind) {
  ClusterSection section;
  section.nodes = 2;
  section.network = "roce-100";
  EXPECT_EQ(ResolveCluster(section)->nics_per_node, section.gpus_per_node);
  section.network = "eth-100";
  EXPECT_EQ(ResolveCluster(section)->nics_per_node, 1);
  EXPECT_DOUBLE_EQ(ResolveCluster(section)->inter_gbps_per_gpu(), 12.0 / section.gpus_per_node);
  section.nics_per_node = 2;
  EXPECT_EQ(ResolveCluster(section)->nics_per_node, 2);
}

TEST(CatalogTest, RecipeOverridesWinOverTheCatalog) {
  ClusterSection section;
  section.nodes = 4;
  section.gpu = "a100-40gb";
  section.network = "roce-200";
  section.peak_tflops = 280;
  section.inter_gbps = 20;
  section.nics_per_node = 2;
  absl::StatusOr<ClusterSpec> cluster = ResolveCluster(section);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(cluster->world_size(), 32);
  EXPECT_EQ(cluster->peak_tflops, 280);
  EXPECT_EQ(cluster->gpu_memory_gib, 40);
  EXPECT_EQ(cluster->intra_gbps, 230);
  EXPECT_EQ(cluster->nic_gbps, 20);
  EXPECT_EQ(cluster->network_transport, Transport::kRoce);
  EXPECT_DOUBLE_EQ(cluster->inter_gbps_per_gpu(), 20.0 * 2 / 8);
}

TEST(CatalogTest, UnknownNamesNameTheKeyAndTheChoices) {
  ClusterSection section;
  section.gpu = "h100";
  absl::StatusOr<ClusterSpec> cluster = ResolveCluster(section);
  ASSERT_FALSE(cluster.ok());
  EXPECT_THAT(std::string(cluster.status().message()),
              HasSubstr("cluster.gpu: 'h100' is not in the catalog; use one of a100-40gb"));
  section.gpu = "h100-sxm";
  section.network = "nvlink4";  // a link inside a node, not a network
  cluster = ResolveCluster(section);
  ASSERT_FALSE(cluster.ok());
  EXPECT_THAT(std::string(cluster.status().message()), HasSubstr("cluster.network: 'nvlink4'"));
}

TEST(CatalogTest, RecipeReadsTheClusterSection) {
  absl::StatusOr<Recipe> recipe =
      ParseRecipe("data: {train: [a.txt]}\ncluster: {nodes: 16, gpu: h200, network: ib-hdr}\n",
                  "t.yaml", {"cluster.inter_latency_us=4"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->cluster.nodes, 16);
  EXPECT_EQ(recipe->cluster.gpus_per_node, 8);
  EXPECT_EQ(recipe->cluster.inter_latency_us, 4);
  absl::StatusOr<Recipe> bad =
      ParseRecipe("data: {train: [a.txt]}\ncluster: {nodes: 0}\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cluster.nodes"));
}

}  // namespace
}  // namespace dtrain
