#include "launch/hostlist.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// More digits than this cannot be a node number and would overflow int64 arithmetic.
constexpr size_t kMaxDigits = 9;

struct Range {
  int64_t lo = 0;
  int64_t hi = 0;
  int width = 0;  // zero padding: the number of digits written for lo
};

// One host pattern: literals[0] group[0] literals[1] group[1] ... literals[n].
struct Pattern {
  std::vector<std::string> literals;
  std::vector<std::vector<Range>> groups;
};

absl::Status HostlistError(absl::string_view token, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("hostlist token '", token, "': ", problem,
                   " (expected prefix[lo-hi,n,...]suffix, e.g. node[01-04,07])"));
}

absl::StatusOr<int64_t> ParseNumber(absl::string_view token, absl::string_view item,
                                    absl::string_view digits) {
  if (digits.empty()) return HostlistError(token, absl::StrCat("empty number in '", item, "'"));
  if (digits.front() == '-') {
    return HostlistError(token, absl::StrCat("negative number in '", item, "'"));
  }
  for (const char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return HostlistError(token, absl::StrCat("'", item, "' is not a number or a lo-hi range"));
    }
  }
  if (digits.size() > kMaxDigits) {
    return HostlistError(token, absl::StrCat("number '", digits, "' is too large"));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(digits, &value)) {
    return HostlistError(token, absl::StrCat("'", item, "' is not a number"));
  }
  return value;
}

absl::StatusOr<Range> ParseRange(absl::string_view token, absl::string_view item) {
  if (item.empty()) return HostlistError(token, "empty range");
  if (item.front() == '-') {
    return HostlistError(token, absl::StrCat("negative number in '", item, "'"));
  }
  const size_t dash = item.find('-');
  Range range;
  const absl::string_view lo_digits = item.substr(0, dash);
  ASSIGN_OR_RETURN(range.lo, ParseNumber(token, item, lo_digits));
  range.width = static_cast<int>(lo_digits.size());
  range.hi = range.lo;
  if (dash != absl::string_view::npos) {
    ASSIGN_OR_RETURN(range.hi, ParseNumber(token, item, item.substr(dash + 1)));
  }
  if (range.lo > range.hi) {
    return HostlistError(token, absl::StrCat("range '", item, "' has lo > hi; write it as ",
                                             item.substr(dash + 1), "-", lo_digits));
  }
  return range;
}

// Parses one top-level token (brackets already known to be balanced and not nested).
absl::StatusOr<Pattern> ParsePattern(absl::string_view token) {
  Pattern pattern;
  pattern.literals.emplace_back();
  size_t i = 0;
  while (i < token.size()) {
    if (token[i] != '[') {
      pattern.literals.back().push_back(token[i++]);
      continue;
    }
    const size_t close = token.find(']', i);  // present: CheckBrackets ran first
    const absl::string_view body = token.substr(i + 1, close - i - 1);
    if (body.empty()) return HostlistError(token, "empty range '[]'");
    std::vector<Range> group;
    for (const absl::string_view item : absl::StrSplit(body, ',')) {
      ASSIGN_OR_RETURN(Range range, ParseRange(token, item));
      group.push_back(range);
    }
    pattern.groups.push_back(std::move(group));
    pattern.literals.emplace_back();
    i = close + 1;
  }
  return pattern;
}

// Splits at top-level separators, checking that brackets pair up and do not nest.
absl::StatusOr<std::vector<absl::string_view>> SplitTokens(absl::string_view hostlist) {
  std::vector<absl::string_view> tokens;
  size_t start = 0;
  size_t open = absl::string_view::npos;  // position of the unclosed '[', if any
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    const bool at_end = i == hostlist.size();
    if (open != absl::string_view::npos) {
      if (at_end) {
        return HostlistError(hostlist.substr(start), "missing ']'");
      }
      if (c == '[') return HostlistError(hostlist.substr(start), "unbalanced '[' inside '[...]'");
      if (c == ']') open = absl::string_view::npos;
      if (c == ' ' || c == '\t' || c == '\n') {
        return HostlistError(hostlist.substr(start, i - start), "missing ']'");
      }
      continue;
    }
    if (c == '[') {
      open = i;
    } else if (c == ']') {
      return HostlistError(hostlist.substr(start, i + 1 - start), "unbalanced ']'");
    } else if (c == ',' || c == ' ' || c == '\t' || c == '\n') {
      if (i > start) tokens.push_back(hostlist.substr(start, i - start));
      start = i + 1;
    }
  }
  return tokens;
}

absl::StatusOr<std::vector<Pattern>> ParseHostlist(absl::string_view hostlist) {
  ASSIGN_OR_RETURN(const std::vector<absl::string_view> tokens, SplitTokens(hostlist));
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostlist '", hostlist, "' names no hosts; expected e.g. node[01-04]"));
  }
  std::vector<Pattern> patterns;
  for (const absl::string_view token : tokens) {
    ASSIGN_OR_RETURN(Pattern pattern, ParsePattern(token));
    patterns.push_back(std::move(pattern));
  }
  return patterns;
}

// A plain decimal number: digits only (no sign, no spaces), at most kMaxDigits of them.
bool ParseDigits(absl::string_view text, int* value) {
  if (text.empty() || text.size() > kMaxDigits) return false;
  for (const char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, value);
}

std::string Number(int64_t value, int width) { return absl::StrFormat("%0*d", width, value); }

void ExpandInto(const Pattern& pattern, size_t group, std::string& prefix,
                std::vector<std::string>& hosts) {
  const size_t length = prefix.size();
  prefix += pattern.literals[group];
  if (group == pattern.groups.size()) {
    hosts.push_back(prefix);
  } else {
    for (const Range& range : pattern.groups[group]) {
      for (int64_t n = range.lo; n <= range.hi; ++n) {
        const size_t before = prefix.size();
        prefix += Number(n, range.width);
        ExpandInto(pattern, group + 1, prefix, hosts);
        prefix.resize(before);
      }
    }
  }
  prefix.resize(length);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist_view) {
  const absl::string_view hostlist(hostlist_view.data(), hostlist_view.size());
  ASSIGN_OR_RETURN(const std::vector<Pattern> patterns, ParseHostlist(hostlist));
  int64_t total = 0;
  for (const Pattern& pattern : patterns) {
    int64_t count = 1;
    for (const std::vector<Range>& group : pattern.groups) {
      int64_t group_count = 0;
      for (const Range& range : group) group_count += range.hi - range.lo + 1;
      // Each factor is below 1e9 * items; compare before multiplying so nothing overflows.
      if (group_count > kMaxHostlistHosts || count > kMaxHostlistHosts / group_count) {
        count = int64_t{kMaxHostlistHosts} + 1;
        break;
      }
      count *= group_count;
    }
    total += count;
    if (total > kMaxHostlistHosts) {
      return absl::InvalidArgumentError(absl::StrCat("hostlist '", hostlist.substr(0, 200),
                                                     "' expands to more than ", kMaxHostlistHosts,
                                                     " hosts; check the ranges"));
    }
  }
  std::vector<std::string> hosts;
  hosts.reserve(total);
  std::string prefix;
  for (const Pattern& pattern : patterns) ExpandInto(pattern, 0, prefix, hosts);
  return hosts;
}

absl::StatusOr<std::string> FirstHost(std::string_view hostlist_view) {
  const absl::string_view hostlist(hostlist_view.data(), hostlist_view.size());
  ASSIGN_OR_RETURN(const std::vector<Pattern> patterns, ParseHostlist(hostlist));
  const Pattern& first = patterns.front();
  std::string host = first.literals[0];
  for (size_t g = 0; g < first.groups.size(); ++g) {
    const Range& range = first.groups[g].front();
    absl::StrAppend(&host, Number(range.lo, range.width), first.literals[g + 1]);
  }
  return host;
}

absl::StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view tasks_per_node_view) {
  const absl::string_view tasks_per_node(tasks_per_node_view.data(), tasks_per_node_view.size());
  const auto error = [tasks_per_node](absl::string_view item) {
    return absl::InvalidArgumentError(
        absl::StrCat("tasks per node '", tasks_per_node, "': item '", item,
                     "' is not a count or COUNT(xNODES), as in 2(x3),1"));
  };
  std::vector<int> counts;
  for (const absl::string_view item : absl::StrSplit(tasks_per_node, ',')) {
    absl::string_view count_text = item;
    int repeat = 1;
    if (const size_t paren = item.find('('); paren != absl::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') {
        return error(item);
      }
      if (!ParseDigits(item.substr(paren + 2, item.size() - paren - 3), &repeat) || repeat < 1) {
        return error(item);
      }
      count_text = item.substr(0, paren);
    }
    int count = 0;
    if (!ParseDigits(count_text, &count)) return error(item);
    if (repeat > kMaxHostlistHosts - static_cast<int>(counts.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tasks per node '", tasks_per_node, "' names more than ", kMaxHostlistHosts, " nodes"));
    }
    counts.insert(counts.end(), repeat, count);
  }
  return counts;
}

bool IsBlockDistribution(std::string_view distribution) {
  return distribution.empty() || distribution.starts_with("block");
}

int NodeOfBlockTask(const std::vector<int>& tasks_per_node, int task) {
  int first = 0;
  for (size_t node = 0; node < tasks_per_node.size(); ++node) {
    if (task >= first && task < first + tasks_per_node[node]) return static_cast<int>(node);
    first += tasks_per_node[node];
  }
  return -1;
}

}  // namespace dtrain
