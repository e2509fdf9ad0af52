// Slurm hostlist and tasks-per-node expansion: every grammar case of src/common/hostlist.c that
// srun publishes, and every error with its message.
#include "launch/hostlist.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Hosts(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(list);
  EXPECT_TRUE(hosts.ok()) << list << ": " << hosts.status();
  return hosts.ok() ? *hosts : std::vector<std::string>{};
}

std::string Error(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(list);
  EXPECT_FALSE(hosts.ok()) << list << " expanded";
  absl::StatusOr<std::string> first = FirstHost(list);
  EXPECT_FALSE(first.ok()) << list << " has a first host";
  return hosts.ok() ? "" : std::string(hosts.status().message());
}

TEST(HostlistTest, PlainNamesAndSeparators) {
  EXPECT_THAT(Hosts("n1"), ElementsAre("n1"));
  EXPECT_THAT(Hosts("a,b c\td\ne"), ElementsAre("a", "b", "c", "d", "e"));
  EXPECT_THAT(Hosts("a,,b, c"), ElementsAre("a", "b", "c"));
}

TEST(HostlistTest, RangesAndSingleValues) {
  EXPECT_THAT(Hosts("node[1-3]"), ElementsAre("node1", "node2", "node3"));
  EXPECT_THAT(Hosts("node[1,3,5-6]"), ElementsAre("node1", "node3", "node5", "node6"));
  EXPECT_THAT(Hosts("node[7]"), ElementsAre("node7"));
}

TEST(HostlistTest, ZeroPaddingIsTheWidthOfLo) {
  EXPECT_THAT(Hosts("x[001-003]"), ElementsAre("x001", "x002", "x003"));
  EXPECT_THAT(Hosts("node[8-10]"), ElementsAre("node8", "node9", "node10"));
  EXPECT_THAT(Hosts("n[09-11]"), ElementsAre("n09", "n10", "n11"));
  EXPECT_THAT(Hosts("n[98-100]"), ElementsAre("n98", "n99", "n100"));
}

TEST(HostlistTest, SuffixAfterBracket) {
  EXPECT_THAT(Hosts("gpu-a[1-2]-ib"), ElementsAre("gpu-a1-ib", "gpu-a2-ib"));
}

TEST(HostlistTest, SeveralGroupsMultiplyLeftOutermost) {
  EXPECT_THAT(Hosts("rack[1-2]-n[3-4]"),
              ElementsAre("rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"));
}

TEST(HostlistTest, CommasInsideBracketsAreNotSeparators) {
  EXPECT_THAT(
      Hosts("node[01-04,07],gpu-a[1-2]-ib"),
      ElementsAre("node01", "node02", "node03", "node04", "node07", "gpu-a1-ib", "gpu-a2-ib"));
}

TEST(HostlistTest, DuplicatesAndOrderAreKept) {
  EXPECT_THAT(Hosts("n[2,1,2],n1"), ElementsAre("n2", "n1", "n2", "n1"));
}

TEST(HostlistTest, FirstHostDoesNotTakeTheRegexShortcut) {
  EXPECT_EQ(*FirstHost("node[01-04,07],gpu-a[1-2]-ib"), "node01");
  EXPECT_EQ(*FirstHost("gpu-a[1-2]-ib,node1"), "gpu-a1-ib");
  EXPECT_EQ(*FirstHost("rack[2-3]-n[04-05]"), "rack2-n04");
  EXPECT_EQ(*FirstHost(" login1"), "login1");
}

TEST(HostlistTest, FirstHostOfAHugeListIsCheap) {
  EXPECT_EQ(*FirstHost("n[000000001-999999999]"), "n000000001");
  EXPECT_FALSE(ExpandHostlist("n[000000001-999999999]").ok());
}

TEST(HostlistTest, ReversedRangeIsAnError) {
  EXPECT_THAT(Error("node[3-1]"),
              HasSubstr("hostlist token 'node[3-1]': range '3-1' has lo > hi; write it as 1-3"));
}

TEST(HostlistTest, MissingCloseBracketIsAnError) {
  EXPECT_THAT(Error("node[1-3"), HasSubstr("'node[1-3': missing ']'"));
  EXPECT_THAT(Error("node[1-3 other"), HasSubstr("missing ']'"));
}

TEST(HostlistTest, UnbalancedBracketsAreErrors) {
  EXPECT_THAT(Error("node1-3]"), HasSubstr("unbalanced ']'"));
  EXPECT_THAT(Error("node[1[2]]"), HasSubstr("unbalanced '[' inside '[...]'"));
}

TEST(HostlistTest, NegativeNumbersAreErrors) {
  EXPECT_THAT(Error("node[-1]"), HasSubstr("negative number in '-1'"));
  EXPECT_THAT(Error("node[1--3]"), HasSubstr("negative number in '1--3'"));
}

TEST(HostlistTest, EmptyRangesAreErrors) {
  EXPECT_THAT(Error("node[]"), HasSubstr("empty range '[]'"));
  EXPECT_THAT(Error("node[1,]"), HasSubstr("empty range"));
  EXPECT_THAT(Error("node[1-]"), HasSubstr("empty number in '1-'"));
}

TEST(HostlistTest, NonNumericRangesAreErrors) {
  EXPECT_THAT(Error("node[a-b]"), HasSubstr("'a-b' is not a number or a lo-hi range"));
  EXPECT_THAT(Error("node[1-2-3]"), HasSubstr("'1-2-3' is not a number or a lo-hi range"));
  EXPECT_THAT(Error("node[ 1]"), HasSubstr("missing ']'"));
}

TEST(HostlistTest, EmptyListIsAnError) {
  EXPECT_THAT(Error(""), HasSubstr("names no hosts"));
  EXPECT_THAT(Error(" ,\n"), HasSubstr("names no hosts"));
}

TEST(HostlistTest, AbsurdSizesAreErrors) {
  EXPECT_THAT(Error("n[0-9999999999]"), HasSubstr("number '9999999999' is too large"));
  EXPECT_THAT(ExpandHostlist("n[1-2000000]").status().message(),
              HasSubstr("expands to more than 1048576 hosts"));
  EXPECT_THAT(ExpandHostlist("a[1-1024]b[1-1024]c[1-2]").status().message(),
              HasSubstr("expands to more than 1048576 hosts"));
  EXPECT_EQ(ExpandHostlist("a[1-1024]b[1-1024]")->size(), 1u << 20);
}

TEST(TasksPerNodeTest, ExpandsRepeats) {
  EXPECT_THAT(*ExpandTasksPerNode("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(*ExpandTasksPerNode("4"), ElementsAre(4));
  EXPECT_THAT(*ExpandTasksPerNode("1,3(x2)"), ElementsAre(1, 3, 3));
}

TEST(TasksPerNodeTest, BlockDistributionFillsEachNodeInTurn) {
  const std::vector<int> counts = {2, 1, 3};
  std::vector<int> nodes;
  for (int task = 0; task < 7; ++task) nodes.push_back(NodeOfBlockTask(counts, task));
  EXPECT_EQ(nodes, (std::vector<int>{0, 0, 1, 2, 2, 2, -1}));
  EXPECT_EQ(NodeOfBlockTask(counts, -1), -1);
}

TEST(TasksPerNodeTest, MalformedItemsAreErrors) {
  for (const char* bad : {"", "2(x)", "2(3)", "2(x3", "a", "-1", "2,", "2(x0)", " 2"}) {
    absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(bad);
    ASSERT_FALSE(counts.ok()) << bad;
    EXPECT_THAT(counts.status().message(), HasSubstr("is not a count or COUNT(xNODES)")) << bad;
  }
  EXPECT_THAT(ExpandTasksPerNode("1(x1048576),1").status().message(),
              HasSubstr("names more than 1048576 nodes"));
}

}  // namespace
}  // namespace dtrain
