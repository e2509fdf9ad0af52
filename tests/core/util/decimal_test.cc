#include "core/util/decimal.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(DecimalTest, ReadsDecimalNumbersAsWritten) {
  const std::pair<const char*, double> cases[] = {{"3e-4", 3e-4},    {"-0.5", -0.5}, {"+2", 2},
                                                  {"6E4", 6e4},      {".25", 0.25},  {"5.", 5},
                                                  {" 1.5e3 ", 1500}, {"0", 0}};
  for (const auto& [text, expected] : cases) {
    double value = -1;
    EXPECT_TRUE(ParseDecimal(text, &value)) << text;
    EXPECT_EQ(value, expected) << text;
  }
}

// strtod, which absl::SimpleAtod calls, reads the first five as 16, 1/1024, 1/16, infinity and
// NaN.
TEST(DecimalTest, RefusesWhatIsNoDecimalNumber) {
  for (const char* text : {"0x10", "0x1p-10", "0X.1", "inf", "-nan", "1e999", "", "+", "+-1", "1 2",
                           "1e", "e5", "1_000", "--1", "1.2.3", "3e-4x"}) {
    double value = 0;
    EXPECT_FALSE(ParseDecimal(text, &value)) << text << " read as " << value;
  }
}

}  // namespace
}  // namespace dtrain
