#include "core/model/recompute.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(RecomputeTest, NamesReadBack) {
  for (Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    absl::StatusOr<Recompute> parsed = ParseRecompute(RecomputeName(recompute));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, recompute);
  }
}

TEST(RecomputeTest, UnknownNameNamesTheKeyAndTheChoices) {
  absl::StatusOr<Recompute> parsed = ParseRecompute("attention");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(),
            "parallel.recompute: 'attention' is not one of none, selective, full");
}

}  // namespace
}  // namespace dtrain
