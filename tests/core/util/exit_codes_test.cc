#include "core/util/exit_codes.h"

#include "core/util/status.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(ExitCodesTest, AStatusCarriesItsExitCodeThroughARename) {
  absl::Status status = absl::ResourceExhaustedError("write rank-0.bin: no space");
  EXPECT_EQ(ExitCodeOf(status), std::nullopt);
  SetExitCode(status, kExitDiskFull);
  EXPECT_EQ(ExitCodeOf(status), kExitDiskFull);
  EXPECT_EQ(ExitCodeOf(Renamed(status, "rank 1 failed: write rank-0.bin: no space")),
            kExitDiskFull);
  EXPECT_EQ(ExitCodeOf(absl::Status(status.code(), status.message())), std::nullopt);
}

}  // namespace
}  // namespace dtrain
