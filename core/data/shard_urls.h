// Shard URL patterns (data.shards): items separated by "::" (not inside the brackets of an IPv6
// host; the whitespace around an item dropped), each expanded for brace
// expressions, left to right: "{000..123}" is a numeric range (zero padding kept; it may count
// down) and "{a,b,c}" a list. "s3-{0..1}/x-{00..02}.tar" gives 6 URLs. In a "pipe:" command,
// braces that are neither (${HOME}, an awk program) or have no partner stay as they are, as in
// bash. Pure function.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

// InvalidArgument naming the pattern for an unmatched brace or one that is no range or list
// (outside pipe: commands), an empty item, a glob, a bad range or more than 10 million URLs.
absl::StatusOr<std::vector<std::string>> ExpandShardUrls(const std::string& pattern);

// `pattern` with each item that is a relative local path (a plain path, or file:PATH) under `dir`:
// the shards a run named relative to its working folder, from another folder.
std::string ShardPatternFrom(const std::string& dir, const std::string& pattern);

}  // namespace dtrain
