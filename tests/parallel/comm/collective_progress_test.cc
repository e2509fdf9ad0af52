#include "parallel/comm/collective_progress.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/parallel/comm/test_store.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Three members of a group whose world ranks are 5, 6 and 7; the last never starts a collective.
// Diagnosing collective #2, which the second started too, the first names and blames world rank 7
// only; diagnosing #3, which nobody else started, both, furthest behind first: 7, then 6.
TEST(CollectiveProgressTest, NamesAndBlamesThePeersThatNeverStartedTheCollective) {
  auto store = std::make_shared<testing::InMemoryStore>();
  const std::vector<int> world = {5, 6, 7};
  CollectiveProgress first(store, "g/", 0, 3, world), second(store, "g/", 1, 3, world);
  first.Started(1);
  second.Started(1);
  second.Started(2);
  first.Started(2);
  std::vector<int> blamed;
  const std::string why = first.Diagnose(2, /*timed_out=*/true, blamed);
  EXPECT_THAT(why, HasSubstr("never started by rank 7 (started no collective)")) << why;
  EXPECT_THAT(blamed, ElementsAre(7));
  // Collective #3, which the second has not started either: last started #2.
  blamed.clear();
  const std::string later = first.Diagnose(3, /*timed_out=*/false, blamed);
  EXPECT_THAT(
      later, HasSubstr("never started by rank 7 (started no collective), rank 6 (last started #2)"))
      << later;
  EXPECT_THAT(blamed, ElementsAre(7, 6));
}

// Two members that both started the collective: when it timed out, only the peer can have held it
// up; when it failed otherwise, nobody is blamed.
TEST(CollectiveProgressTest, OfTwoThatBothStartedATimeoutBlamesThePeer) {
  auto store = std::make_shared<testing::InMemoryStore>();
  CollectiveProgress first(store, "pair/", 0, 2, {}), second(store, "pair/", 1, 2, {});
  first.Started(1);
  second.Started(1);
  std::vector<int> blamed;
  const std::string timed_out = first.Diagnose(1, /*timed_out=*/true, blamed);
  EXPECT_THAT(timed_out, HasSubstr("its one peer, rank 1, never completed its part")) << timed_out;
  EXPECT_THAT(blamed, ElementsAre(1));
  blamed.clear();
  EXPECT_EQ(second.Diagnose(1, /*timed_out=*/false, blamed), "every rank started this operation");
  EXPECT_TRUE(blamed.empty());
}

// Groups keep their records apart by key prefix.
TEST(CollectiveProgressTest, GroupsWithOtherPrefixesDoNotCount) {
  auto store = std::make_shared<testing::InMemoryStore>();
  CollectiveProgress mine(store, "a/", 0, 2, {}), other(store, "b/", 1, 2, {});
  mine.Started(1);
  other.Started(1);
  std::vector<int> blamed;
  EXPECT_THAT(mine.Diagnose(1, /*timed_out=*/false, blamed),
              HasSubstr("rank 1 (started no collective)"));
  EXPECT_THAT(blamed, ElementsAre(1));
}

}  // namespace
}  // namespace dtrain
