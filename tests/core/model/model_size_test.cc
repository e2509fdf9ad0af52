#include "core/model/model_size.h"

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

Recipe Parsed(const std::vector<std::string>& overrides) {
  absl::StatusOr<Recipe> recipe = ParseRecipe("data:\n  train: [x.txt]\n", "t.yaml", overrides);
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return *recipe;
}

// Within every key's range, yet 3.4e15 parameters: refused with the figures, not allocated.
TEST(ModelSizeTest, TooManyParametersNamesKeysAndBound) {
  const absl::Status status =
      CheckModelSize(Parsed({"model.n_layer=65536", "model.d_model=65536"}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(status.message()),
      AllOf(HasSubstr("model.n_layer 65536, model.d_model 65536"), HasSubstr("3.38e+15 parameters"),
            HasSubstr("bound of 1e+13 parameters"), HasSubstr("lower n_layer or d_model")));
}

TEST(ModelSizeTest, TooManyActivationsOrTokensNamesTheBatch) {
  // About 2.3 MB of activations per token at d_model 8192: 1.28e8 tokens are 2.9e14 bytes.
  EXPECT_THAT(std::string(CheckModelSize(Parsed({"model.d_model=8192", "train.micro_batch=1000000",
                                                 "train.batch_size=1000000"}))
                              .message()),
              AllOf(HasSubstr("train.micro_batch 1000000 x train.seq_len 128"),
                    HasSubstr("bound of 1e+14 bytes"), HasSubstr("parallel.recompute: full")));
  EXPECT_THAT(std::string(CheckModelSize(Parsed({"train.micro_batch=2000000000",
                                                 "train.batch_size=2000000000"}))
                              .message()),
              HasSubstr("2^31 - 1"));
}

TEST(ModelSizeTest, EveryShippedConfigFits) {
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(DTRAIN_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    absl::StatusOr<Recipe> recipe = LoadRecipe(entry.path().string());
    ASSERT_TRUE(recipe.ok()) << recipe.status();
    EXPECT_TRUE(CheckModelSize(*recipe).ok()) << entry.path() << ": " << CheckModelSize(*recipe);
  }
}

}  // namespace
}  // namespace dtrain
