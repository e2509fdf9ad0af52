#include "core/data/shard_urls.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

using Urls = std::vector<std::string>;

TEST(ShardUrlsTest, ExpandsRangesKeepingZeroPadding) {
  EXPECT_EQ(*ExpandShardUrls("train-{000008..000011}.tar"),
            (Urls{"train-000008.tar", "train-000009.tar", "train-000010.tar", "train-000011.tar"}));
  EXPECT_EQ(*ExpandShardUrls("s{9..11}"), (Urls{"s9", "s10", "s11"}));
  EXPECT_EQ(*ExpandShardUrls("s{2..0}"), (Urls{"s2", "s1", "s0"}));
}

TEST(ShardUrlsTest, ExpandsListsProductsAndDoubleColonItems) {
  EXPECT_EQ(*ExpandShardUrls("http://h/{a,b}-{0..1}.tar::pipe:cat x.tar::file:/d/y.tar"),
            (Urls{"http://h/a-0.tar", "http://h/a-1.tar", "http://h/b-0.tar", "http://h/b-1.tar",
                  "pipe:cat x.tar", "file:/d/y.tar"}));
}

TEST(ShardUrlsTest, RejectsMalformedPatterns) {
  for (const char* bad : {"a{0..3", "a}b", "a{x..3}", "a{3}", "a::::b", "a{0..99999999}"}) {
    absl::StatusOr<Urls> urls = ExpandShardUrls(bad);
    EXPECT_FALSE(urls.ok()) << bad;
    if (!urls.ok()) {
      EXPECT_NE(urls.status().message().find(bad), std::string::npos) << bad;
    }
  }
}

// In a pipe: command, braces that are no range or list, or lack a partner, stay as bash leaves
// them (they were refused: ${HOME}, awk programs); its ranges and lists still expand.
TEST(ShardUrlsTest, APipeCommandsOtherBracesStayAsTheyAre) {
  EXPECT_EQ(*ExpandShardUrls("pipe:cat ${HOME}/s-{0..1}.tar"),
            (Urls{"pipe:cat ${HOME}/s-0.tar", "pipe:cat ${HOME}/s-1.tar"}));
  EXPECT_EQ(*ExpandShardUrls("pipe:awk '{print}' x.tar | tail -c +1 } {"),
            (Urls{"pipe:awk '{print}' x.tar | tail -c +1 } {"}));
  EXPECT_FALSE(ExpandShardUrls("/d/${HOME}.tar").ok());  // outside a command, a typo
}

// An IPv6 host's "::" is no separator, and the whitespace around items (a YAML folded list's
// newlines) is dropped: they gave "http://[" and URLs ending in a newline.
TEST(ShardUrlsTest, IpV6HostsAndFoldedListsSplitWhereTheyShould) {
  EXPECT_EQ(
      *ExpandShardUrls("http://[::1]:8000/s-{0..1}.tar::http://[fe80::2]/t.tar"),
      (Urls{"http://[::1]:8000/s-0.tar", "http://[::1]:8000/s-1.tar", "http://[fe80::2]/t.tar"}));
  EXPECT_EQ(*ExpandShardUrls("/d/a.tar ::\n /d/b.tar\n"), (Urls{"/d/a.tar", "/d/b.tar"}));
}

// A shell glob is not expanded (as in WebDataset): refused with the forms that are, where it was
// read as a file name and failed at the first open; a pipe: command keeps its own.
TEST(ShardUrlsTest, AGlobIsRefusedNamingTheFormsThatExpand) {
  const absl::StatusOr<Urls> glob = ExpandShardUrls("/data/shards/*.tar");
  ASSERT_FALSE(glob.ok());
  EXPECT_NE(glob.status().message().find("has a glob (*), which is not expanded: write the shards "
                                         "as a brace range"),
            std::string::npos)
      << glob.status();
  EXPECT_TRUE(ExpandShardUrls("pipe:cat /data/*.tar").ok());
}

// Relative local items move under the folder; absolute paths, URLs and commands stay as written.
TEST(ShardUrlsTest, APatternFromAnotherFolderMovesOnlyItsRelativePaths) {
  EXPECT_EQ(ShardPatternFrom("/run",
                             "s-{0..1}.tar :: /d/t.tar::pipe:cat x.tar::http://[::1]/u.tar"
                             "::file:v.tar"),
            "/run/s-{0..1}.tar::/d/t.tar::pipe:cat x.tar::http://[::1]/u.tar::file:/run/v.tar");
}

}  // namespace
}  // namespace dtrain
