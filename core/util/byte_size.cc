#include "core/util/byte_size.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/util/decimal.h"

namespace dtrain {

absl::StatusOr<int64_t> ParseByteSize(absl::string_view name, absl::string_view text,
                                      int64_t minimum) {
  // Longest suffixes first: "mib" before "b".
  static constexpr std::pair<absl::string_view, double> kUnits[] = {
      {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40}, {"kb", 1e3},
      {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12},    {"k", 0x1p10},   {"m", 0x1p20},
      {"g", 0x1p30},   {"t", 0x1p40},   {"b", 1.0}};
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  absl::string_view number = lower;
  double scale = 1;
  for (const auto& [unit, factor] : kUnits) {
    if (absl::EndsWith(number, unit)) {
      number.remove_suffix(unit.size());
      scale = factor;
      break;
    }
  }
  double value = 0;
  const bool parsed = ParseDecimal(number, &value);
  const double bytes = value * scale;
  if (parsed && bytes >= 0 && bytes < static_cast<double>(std::max<int64_t>(minimum, 1))) {
    return absl::InvalidArgumentError(
        minimum <= 1 ? absl::StrCat(name, " '", text, "' is less than a byte; give at least 1")
                     : absl::StrCat(name, " '", text, "' is less than ", minimum,
                                    " bytes; give at least ", minimum));
  }
  if (!parsed || !(bytes >= 1) || bytes > 0x1p62) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " '", text, "' is not a byte size; write e.g. 4096, 64K, 64MB or 1GiB"));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace dtrain
