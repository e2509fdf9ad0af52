// Numbers as people write them in a recipe or on a command line.
#pragma once

#include "absl/strings/string_view.h"

namespace dtrain {

// A finite decimal number: an optional sign, digits with an optional point, an optional exponent
// (1e-3, -0.5, +2, 6E4), with whitespace around it. False for anything else, hexadecimal (0x10),
// inf and nan included, which strtod and absl::SimpleAtod read as numbers; and for a value
// beyond a double's range.
bool ParseDecimal(absl::string_view text, double* value);

}  // namespace dtrain
