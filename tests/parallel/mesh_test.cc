#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "core/recipe/recipe.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/trainer.h"
#include "tests/parallel/comm/test_store.h"

namespace dtrain {
namespace {

TEST(MeshTest, RanksAreTpInnermostThenDpThenPp) {
  for (MeshShape shape :
       {MeshShape{.dp = 2, .pp = 3, .tp = 4}, MeshShape{.dp = 1, .pp = 1, .tp = 8},
        MeshShape{.dp = 8, .pp = 1, .tp = 1}, MeshShape{.dp = 3, .pp = 2, .tp = 1}}) {
    const int world = shape.dp * shape.pp * shape.tp;
    for (int rank = 0; rank < world; ++rank) {
      absl::StatusOr<Mesh> mesh = Mesh::Create(shape, world, rank);
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      const MeshCoords c = mesh->coords();
      EXPECT_EQ(rank, (c.pp * shape.dp + c.dp) * shape.tp + c.tp);
      EXPECT_EQ(mesh->RankAt(c), rank);

      const GroupSpec tp = mesh->TpGroup();
      const GroupSpec dp = mesh->DpGroup();
      const GroupSpec pp = mesh->PpGroup();
      ASSERT_EQ(tp.world_ranks.size(), static_cast<size_t>(shape.tp));
      ASSERT_EQ(dp.world_ranks.size(), static_cast<size_t>(shape.dp));
      ASSERT_EQ(pp.world_ranks.size(), static_cast<size_t>(shape.pp));
      EXPECT_EQ(tp.world_ranks[tp.rank], rank);
      EXPECT_EQ(dp.world_ranks[dp.rank], rank);
      EXPECT_EQ(pp.world_ranks[pp.rank], rank);
      EXPECT_EQ(tp.rank, c.tp);
      EXPECT_EQ(dp.rank, c.dp);
      EXPECT_EQ(pp.rank, c.pp);
      // tp members are consecutive; dp members are tp apart; pp members are dp * tp apart.
      for (int i = 0; i < shape.tp; ++i) EXPECT_EQ(tp.world_ranks[i], rank - c.tp + i);
      for (int i = 0; i < shape.dp; ++i) EXPECT_EQ(dp.world_ranks[i], rank + (i - c.dp) * shape.tp);
      for (int i = 0; i < shape.pp; ++i) {
        EXPECT_EQ(pp.world_ranks[i], rank + (i - c.pp) * shape.dp * shape.tp);
      }
    }
  }
}

// Any rank describes any other (what a failure that blames a peer reports), leaving out the
// dimensions of size 1.
TEST(MeshTest, DescribeNamesAnyRanksStageAndGroupRanks) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({.dp = 2, .pp = 2, .tp = 2}, 8, 0);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->Describe(5), "pipeline stage 1 of 2, tp rank 1, dp rank 0");
  EXPECT_EQ(mesh->Describe(2), "pipeline stage 0 of 2, tp rank 0, dp rank 1");
  absl::StatusOr<Mesh> pipeline = Mesh::Create({.dp = 1, .pp = 4, .tp = 1}, 4, 3);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ(pipeline->Describe(2), "pipeline stage 2 of 4");
  absl::StatusOr<Mesh> one = Mesh::Create({}, 1, 0);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->Describe(0), "");
}

// Only the pipeline's group sends point to point (NCCL connects its pairs for that).
TEST(MeshTest, GroupKeyPrefixesAreSharedByMembersAndDistinctAcrossGroups) {
  const MeshShape shape{.dp = 2, .pp = 2, .tp = 2};
  std::set<std::pair<std::string, std::vector<int>>> groups;
  for (int rank = 0; rank < 8; ++rank) {
    const Mesh mesh = *Mesh::Create(shape, 8, rank);
    for (const GroupSpec& g : {mesh.TpGroup("x/"), mesh.DpGroup("x/"), mesh.PpGroup("x/")}) {
      EXPECT_EQ(g.key_prefix.rfind("x/" + g.name + ".", 0), 0u) << g.key_prefix;
      EXPECT_EQ(g.point_to_point, g.name == "pp") << g.name;
      groups.insert({g.key_prefix, g.world_ranks});
    }
  }
  // 4 groups of each kind, and one prefix per distinct member list.
  EXPECT_EQ(groups.size(), 12u);
  std::set<std::string> prefixes;
  for (const auto& g : groups) prefixes.insert(g.first);
  EXPECT_EQ(prefixes.size(), 12u);
}

// Replicated kv heads: in a dp 2 x tp 4 mesh with each kv head on 2 ranks, the kv replica groups
// are tp ranks {0, 1} and {2, 3} of each tp group, with one key prefix per group.
TEST(MeshTest, KvReplicaGroupsPairConsecutiveTpRanksOfOneTpGroup) {
  const MeshShape shape{.dp = 2, .pp = 1, .tp = 4};
  std::set<std::pair<std::string, std::vector<int>>> groups;
  for (int rank = 0; rank < 8; ++rank) {
    const Mesh mesh = *Mesh::Create(shape, 8, rank);
    const GroupSpec kv = mesh.KvReplicaGroup(2, "x/");
    const int first = rank / 2 * 2;
    EXPECT_EQ(kv.world_ranks, (std::vector<int>{first, first + 1})) << "rank " << rank;
    EXPECT_EQ(kv.rank, rank % 2);
    EXPECT_EQ(kv.key_prefix.rfind("x/kv.", 0), 0u) << kv.key_prefix;
    groups.insert({kv.key_prefix, kv.world_ranks});
  }
  EXPECT_EQ(groups.size(), 4u);  // 4 groups, each with its own prefix
  std::set<std::string> prefixes;
  for (const auto& g : groups) prefixes.insert(g.first);
  EXPECT_EQ(prefixes.size(), 4u);
}

TEST(MeshTest, SizesThatDoNotMultiplyToTheWorldAreRejected) {
  absl::StatusOr<Mesh> mesh = Mesh::Create(MeshShape{.dp = 2, .pp = 2, .tp = 3}, 8, 0);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mesh.status().message().find("dp=2 x pp=2 x tp=3 needs 12 ranks but the world has 8"),
            std::string::npos)
      << mesh.status();
  EXPECT_FALSE(Mesh::Create(MeshShape{.dp = 0, .pp = 1, .tp = 1}, 0, 0).ok());
  EXPECT_FALSE(Mesh::Create(MeshShape{.dp = 2, .pp = 1, .tp = 1}, 2, 2).ok());
}

// The trainer's check before it builds its mesh of dp = world / (tp x pp): with pipeline stages,
// tp x pp must divide the world; the message lists the tp sizes that fit with that pp and the
// model, else the pp sizes that fit with that tp.
TEST(MeshTest, ALayoutWithPipelineStagesFitsAWorldThatTpTimesPpDivides) {
  Recipe recipe;
  recipe.model.n_head = 6;  // tp 1, 2, 3 and 6 split the heads
  recipe.model.d_model = 192;
  recipe.parallel.tp = 2;
  recipe.parallel.pp = 2;
  EXPECT_TRUE(CheckLayoutFitsWorld(recipe, 8).ok());
  EXPECT_TRUE(Mesh::Create(MeshShape{.dp = 8 / 4, .pp = 2, .tp = 2}, 8, 7).ok());
  const absl::Status status = CheckLayoutFitsWorld(recipe, 6);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("parallel.tp = 2 x parallel.pp = 2 does not divide the world "
                                  "of 6 ranks"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("set parallel.tp to one of 1, 3"), std::string::npos) << status;
  // No tp fits 5 ranks with pp 2: the pp sizes that fit tp 2 (none), then the world to run.
  EXPECT_NE(CheckLayoutFitsWorld(recipe, 5).message().find("needs tp x pp ranks; run 4 x k ranks"),
            std::string::npos);
  // pp 3 divides no world of 4 ranks with tp 1 or 2; pp 1 and 2 do.
  recipe.parallel.tp = 1;
  recipe.parallel.pp = 3;
  EXPECT_NE(CheckLayoutFitsWorld(recipe, 4).message().find(
                "set parallel.pp to one of 1, 2, 4, or run 3 x k ranks"),
            std::string::npos)
      << CheckLayoutFitsWorld(recipe, 4);
}

// A 2x2 mesh (dp 2, tp 2) of threads: each group all-reduces its members' world ranks.
TEST(MeshTest, SubGroupCommunicatorsSumOnlyTheirMembers) {
  const MeshShape shape{.dp = 2, .pp = 1, .tp = 2};
  auto store = std::make_shared<testing::InMemoryStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank] {
      const Mesh mesh = *Mesh::Create(shape, 4, rank);
      CommunicatorFactory factory =
          [&](const GroupSpec& group) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        GlooCommunicatorOptions options;
        options.name = group.name;
        options.key_prefix = group.key_prefix;
        options.rank = group.rank;
        options.size = static_cast<int>(group.world_ranks.size());
        options.world_ranks = group.world_ranks;
        options.timeout = absl::Seconds(10);
        return GlooCommunicator::Create(store, options);
      };
      absl::StatusOr<MeshCommunicators> comms = mesh.CreateCommunicators(factory);
      ASSERT_TRUE(comms.ok()) << comms.status();
      auto group_sum = [&](Communicator& comm) {
        float value = static_cast<float>(rank);
        EXPECT_TRUE(comm.AllReduce(&value, 1, ReduceOp::kSum)->Wait().ok());
        return value;
      };
      const MeshCoords c = mesh.coords();
      EXPECT_EQ(comms->tp->name(), "tp");
      EXPECT_EQ(group_sum(*comms->tp), 2 * c.dp * 2 + 1);   // ranks 2dp and 2dp+1
      EXPECT_EQ(group_sum(*comms->dp), c.tp + (c.tp + 2));  // ranks tp and tp+2
      EXPECT_EQ(group_sum(*comms->pp), rank);               // alone
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace
}  // namespace dtrain
