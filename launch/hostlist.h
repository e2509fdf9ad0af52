// Slurm's compressed host lists (`node[01-04,07],gpu-a[1-2]-ib`) and task counts per node
// (`2(x3),1`), as srun and sbatch publish them in SLURM_*_NODELIST and SLURM_*_TASKS_PER_NODE.
//
// Hostlist grammar (src/common/hostlist.c): top-level separators are comma, space, tab and
// newline, except commas inside `[...]`. A host is `prefix[ranges]suffix`, with any number of
// bracket groups; ranges are comma-separated `lo` or `lo-hi` decimal items, zero-padded to the
// length of `lo`. Several groups multiply, the left one outermost. Duplicates are kept, order is
// preserved. Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

// The most hosts (or task counts) one list may expand to; longer lists are an error, not an
// allocation of gigabytes.
inline constexpr int kMaxHostlistHosts = 1 << 20;

// Every host of `hostlist`, in order. Errors name the offending token: a range with lo > hi, a
// missing `]`, an unbalanced bracket, a negative, empty or non-numeric range item, an empty list,
// or more than kMaxHostlistHosts hosts.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist);

// The first host of `hostlist` (`node01` for `node[01-04,07],gpu-a[1-2]-ib`), without expanding
// the list; the whole list is still checked for syntax errors.
absl::StatusOr<std::string> FirstHost(std::string_view hostlist);

// Tasks per node in node-list order: `2(x3),1` gives {2, 2, 2, 1}. Errors on malformed items,
// negative counts and more than kMaxHostlistHosts nodes.
absl::StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view tasks_per_node);

// Whether SLURM_DISTRIBUTION's value (empty: unset) is srun's default block distribution over
// the nodes ("block", "block:cyclic", ...), which NodeOfBlockTask follows.
bool IsBlockDistribution(std::string_view distribution);

// The node (an index into `tasks_per_node`, ExpandTasksPerNode's counts) of task `task` under
// srun's default block distribution, which fills node 0's tasks first; -1 when `task` is past
// the last.
int NodeOfBlockTask(const std::vector<int>& tasks_per_node, int task);

}  // namespace dtrain
