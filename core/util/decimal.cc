#include "core/util/decimal.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace dtrain {

bool ParseDecimal(absl::string_view text, double* value) {
  text = absl::StripAsciiWhitespace(text);
  // from_chars reads a leading '-' but not a '+'; "+-1" stays an error.
  if (absl::ConsumePrefix(&text, "+") && absl::StartsWith(text, "-")) return false;
  const char* end = text.data() + text.size();
  // The general format reads no hexadecimal, but it does read inf and nan.
  const auto [stop, error] = std::from_chars(text.data(), end, *value);
  return error == std::errc() && stop == end && std::isfinite(*value);
}

}  // namespace dtrain
