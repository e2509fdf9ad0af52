#include "core/data/sample_grouper.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/core/data/tar_test_util.h"

namespace dtrain {
namespace {

TEST(SampleGrouperTest, GroupsConsecutiveMembersByKey) {
  std::unique_ptr<ByteSource> source = MemorySource(testing::TarArchive({{"d/x.Input.npy", "1"},
                                                                         {"d/x.txt", "2"},
                                                                         {"README", "skipped"},
                                                                         {"d/y.txt", "3"},
                                                                         {"d/x.txt", "4"}}),
                                                    "http://host/s.tar");
  TarReader reader(source.get());
  SampleGrouper grouper(&reader);
  Sample sample;
  std::vector<std::string> seen;
  while (true) {
    absl::StatusOr<bool> more = grouper.Next(&sample);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    EXPECT_EQ(sample.url, "http://host/s.tar");
    std::string line = sample.key + ":";
    for (const SampleField& field : sample.fields) line += " " + field.extension + "=" + field.data;
    seen.push_back(line);
  }
  // A key seen again later starts a new sample.
  EXPECT_EQ(seen, (std::vector<std::string>{"d/x: input.npy=1 txt=2", "d/y: txt=3", "d/x: txt=4"}));
}

TEST(SampleGrouperTest, RepeatedExtensionNamesBothMembers) {
  std::unique_ptr<ByteSource> source =
      MemorySource(testing::TarArchive({{"k.txt", "a"}, {"k.TXT", "b"}}), "s.tar");
  TarReader reader(source.get());
  SampleGrouper grouper(&reader);
  Sample sample;
  absl::StatusOr<bool> more = grouper.Next(&sample);
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(
      absl::StrContains(more.status().message(), "'k.txt' (byte 0) and 'k.TXT' (byte 1024)"))
      << more.status();
}

TEST(SampleGrouperTest, SplitsNamesAtTheFirstDotOfTheBasename) {
  std::string key, extension;
  ASSERT_TRUE(SplitSampleName("a.b/c.d.E", &key, &extension));
  EXPECT_EQ(key, "a.b/c");
  EXPECT_EQ(extension, "d.e");
  EXPECT_FALSE(SplitSampleName("dir.x/noext", &key, &extension));
}

}  // namespace
}  // namespace dtrain
