#include "core/util/names.h"

#include <algorithm>
#include <limits>

namespace dtrain {

int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

int TypoEdits(absl::string_view name) {
  const int length = static_cast<int>(name.size());
  return std::min(std::max(2, length / 3), length - 1);
}

absl::string_view NearestName(absl::string_view name, const std::vector<absl::string_view>& names) {
  absl::string_view best;
  int best_cost = std::numeric_limits<int>::max();
  for (absl::string_view candidate : names) {
    const int cost = EditDistance(name, candidate);
    if (cost < best_cost) {
      best = candidate;
      best_cost = cost;
    }
  }
  return best_cost <= TypoEdits(name) ? best : absl::string_view();
}

}  // namespace dtrain
