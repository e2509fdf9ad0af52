// Suggestions for misspelled names: recipe keys, commands and their options.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"

namespace dtrain {

// Levenshtein distance: the fewest insertions, deletions and substitutions that turn a into b.
int EditDistance(absl::string_view a, absl::string_view b);

// The most edits a typo of `name` makes: max(2, a third of its length), but fewer than its
// length (two edits turn any two-letter name into any other). More is another word.
int TypoEdits(absl::string_view name);

// The name of `names` closest to `name` where it is close enough to be a typo of it (at most
// TypoEdits(name) edits); empty when none is.
absl::string_view NearestName(absl::string_view name, const std::vector<absl::string_view>& names);

}  // namespace dtrain
