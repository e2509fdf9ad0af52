#include "core/data/shard_urls.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/data/shard_source.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

constexpr size_t kMaxUrls = 10'000'000;

// The alternatives of one brace expression's inside ("000..012" or "a,b"). In a shell command
// (`literal_otherwise`) braces that are neither stay as they are, as bash leaves them: ${HOME},
// an awk program.
absl::StatusOr<std::vector<std::string>> Alternatives(absl::string_view inside,
                                                      const std::string& pattern,
                                                      bool literal_otherwise) {
  const size_t dots = inside.find("..");
  if (dots == absl::string_view::npos) {
    if (inside.find(',') == absl::string_view::npos) {
      if (literal_otherwise) return std::vector<std::string>{absl::StrCat("{", inside, "}")};
      return absl::InvalidArgumentError(
          absl::StrCat("shard pattern '", pattern, "': '{", inside,
                       "}' is neither a range {first..last} nor a list {a,b}"));
    }
    return std::vector<std::string>(absl::StrSplit(inside, ','));
  }
  const absl::string_view first = inside.substr(0, dots);
  const absl::string_view last = inside.substr(dots + 2);
  int64_t a = 0;
  int64_t b = 0;
  if (!absl::SimpleAtoi(first, &a) || !absl::SimpleAtoi(last, &b) || a < 0 || b < 0 ||
      first[0] == '+' || last[0] == '+') {
    return absl::InvalidArgumentError(
        absl::StrCat("shard pattern '", pattern, "': range {", inside,
                     "} needs two non-negative integers, e.g. {000000..000123}"));
  }
  const uint64_t count = static_cast<uint64_t>(a > b ? a - b : b - a) + 1;
  if (count > kMaxUrls) {
    return absl::InvalidArgumentError(absl::StrCat("shard pattern '", pattern, "': range {", inside,
                                                   "} has more than ", kMaxUrls, " values"));
  }
  // Zero padding: "{000..123}" keeps three digits, as shell brace expansion does.
  const bool padded = (first.size() > 1 && first[0] == '0') || (last.size() > 1 && last[0] == '0');
  const size_t width = padded ? std::max(first.size(), last.size()) : 0;
  std::vector<std::string> values;
  values.reserve(count);
  for (int64_t v = a;; v += (a <= b ? 1 : -1)) {
    std::string text = absl::StrCat(v);
    if (text.size() < width) text.insert(0, width - text.size(), '0');
    values.push_back(std::move(text));
    if (v == b) break;
  }
  return values;
}

// Expands `item`, one of `pattern`'s '::'-separated parts. A pipe: command's lone or unmatched
// braces stay as they are, as in bash; elsewhere they are a typo.
absl::Status ExpandItem(const std::string& item, const std::string& pattern,
                        std::vector<std::string>* out) {
  const bool command = absl::StartsWith(item, "pipe:");
  std::vector<std::string> done = {""};
  size_t position = 0;
  const auto keep_literal = [&](size_t end) {
    for (std::string& url : done) url += item.substr(position, end - position);
    position = end;
  };
  while (position < item.size()) {
    const size_t open = item.find('{', position);
    const size_t close = item.find('}', position);
    const size_t end = open == std::string::npos ? std::string::npos : item.find('}', open);
    if (command && (close < open || (open != std::string::npos && end == std::string::npos))) {
      keep_literal(close < open ? close + 1 : item.size());
      continue;
    }
    if (open == std::string::npos) {
      if (close != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard pattern '", pattern, "': '}' without '{'"));
      }
      keep_literal(item.size());
      break;
    }
    if (end == std::string::npos || close < open) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard pattern '", pattern, "': unmatched brace"));
    }
    ASSIGN_OR_RETURN(
        const std::vector<std::string> alternatives,
        Alternatives(absl::string_view(item).substr(open + 1, end - open - 1), pattern, command));
    if (done.size() * alternatives.size() > kMaxUrls) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard pattern '", pattern, "' expands to more than ", kMaxUrls, " URLs"));
    }
    const std::string literal = item.substr(position, open - position);
    std::vector<std::string> next;
    next.reserve(done.size() * alternatives.size());
    for (const std::string& head : done) {
      for (const std::string& alternative : alternatives) {
        next.push_back(absl::StrCat(head, literal, alternative));
      }
    }
    done = std::move(next);
    position = end + 1;
  }
  out->insert(out->end(), done.begin(), done.end());
  return absl::OkStatus();
}

// `pattern`'s items: split at "::" outside square brackets (an IPv6 host, http://[::1]:8000/),
// each without the whitespace around it (a YAML folded list puts newlines between them).
std::vector<absl::string_view> Items(absl::string_view pattern) {
  std::vector<absl::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '[') ++depth;
    if (pattern[i] == ']' && depth > 0) --depth;
    if (depth == 0 && pattern.substr(i, 2) == "::") {
      items.push_back(absl::StripAsciiWhitespace(pattern.substr(start, i - start)));
      start = i + 2;
      ++i;
    }
  }
  items.push_back(absl::StripAsciiWhitespace(pattern.substr(start)));
  return items;
}

}  // namespace

std::string ShardPatternFrom(const std::string& dir, const std::string& pattern) {
  std::vector<std::string> items;
  for (const absl::string_view item : Items(pattern)) {
    std::string text(item);
    const std::optional<std::string> path = LocalShardPath(text);
    if (path && !path->empty() && path->front() != '/') {
      // The scheme ("file:" or none) stays before the path.
      text = absl::StrCat(text.substr(0, text.size() - path->size()),
                          (std::filesystem::path(dir) / *path).string());
    }
    items.push_back(std::move(text));
  }
  return absl::StrJoin(items, "::");
}

absl::StatusOr<std::vector<std::string>> ExpandShardUrls(const std::string& pattern) {
  std::vector<std::string> urls;
  for (absl::string_view item : Items(pattern)) {
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard pattern '", pattern, "' has an empty item between '::'"));
    }
    // A shell's glob: WebDataset's patterns do not expand it either, and a file named so is
    // rare, so a '*' outside a pipe: command is taken for one and refused.
    if (!absl::StartsWith(item, "pipe:") && absl::StrContains(item, '*')) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard pattern '", pattern,
                       "' has a glob (*), which is not expanded: write the shards "
                       "as a brace range (shard-{000000..000099}.tar) or a list joined by '::'"));
    }
    RETURN_IF_ERROR(ExpandItem(std::string(item), pattern, &urls));
    if (urls.size() > kMaxUrls) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard pattern '", pattern, "' expands to more than ", kMaxUrls, " URLs"));
    }
  }
  return urls;
}

}  // namespace dtrain
