// UTF-8 validation for text that leaves the process as JSON or reaches a user's terminal: a JSON
// writer cannot encode a byte that is not UTF-8, so text is checked where it enters (recipe
// values, environment variables) and the message names the first bad byte.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace dtrain {

// The offset of the first byte that does not start or continue a well-formed UTF-8 sequence
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or npos when all are.
size_t FirstInvalidUtf8Byte(absl::string_view text);

// Bytes in the well-formed UTF-8 sequence that starts at text[i], or 0 when none does.
size_t Utf8SequenceLength(absl::string_view text, size_t i);

// "byte 3 (0xff) is not valid UTF-8", for the first bad byte of `text`; empty when it is valid.
std::string DescribeInvalidUtf8(absl::string_view text);

// `text` with each byte that is not valid UTF-8 written as \xNN, safe to print in a message.
std::string EscapeInvalidUtf8(absl::string_view text);

}  // namespace dtrain
