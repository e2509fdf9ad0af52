// Token ids from a WebDataset sample, from the first field present among: "tokens" (uint16
// little-endian), "tokens32" (uint32 little-endian), "json" (a JSON list of ids) and "txt"
// (one token per byte, for byte-level vocabularies). Pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/data/sample_grouper.h"

namespace dtrain {

// Replaces *tokens with the sample's ids. DataLoss naming the shard, the sample key and the fix
// for: no token field, a byte count that is not a whole number of tokens, malformed JSON, an id
// >= vocab_size (with its position).
absl::Status DecodeSampleTokens(const Sample& sample, int vocab_size, std::vector<int32_t>* tokens);

}  // namespace dtrain
