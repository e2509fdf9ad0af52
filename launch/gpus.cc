#include "launch/gpus.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dtrain {

int CountVisibleGpus(const std::string& list, int installed) {
  if (list.empty() || list == "NoDevFiles" || installed == 0) return 0;
  std::set<int> indices;
  std::set<std::string> uuids;
  int visible = 0, gpu_uuids = 0;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const bool gpu_uuid = absl::StartsWith(entry, "GPU-");
    if (gpu_uuid || absl::StartsWith(entry, "MIG-")) {
      // A GPU named twice, or more GPUs than the machine has, is no GPU; a GPU holds several
      // MIG instances.
      if (!uuids.insert(std::string(entry)).second) break;
      if (gpu_uuid && installed > 0 && ++gpu_uuids > installed) break;
      ++visible;
      continue;
    }
    int index = -1;
    if (!absl::SimpleAtoi(entry, &index) || index < 0 || (installed >= 0 && index >= installed) ||
        !indices.insert(index).second) {
      break;
    }
    ++visible;
  }
  return visible;
}

GpuInventory FindGpus(const EnvironmentMap& env, const std::string& proc_root) {
  GpuInventory gpus;
  const std::filesystem::path folder = std::filesystem::path(proc_root) / "driver/nvidia/gpus";
  std::error_code error;
  for (std::filesystem::directory_iterator it(folder, error), end; !error && it != end;
       it.increment(error)) {
    if (it->is_directory(error)) ++gpus.installed;
  }
  gpus.description =
      absl::StrCat(gpus.installed, gpus.installed == 1 ? " GPU" : " GPUs", " in ", folder.string());
  const auto listed = env.find("CUDA_VISIBLE_DEVICES");
  if (listed == env.end()) {
    gpus.visible = gpus.installed;
  } else {
    gpus.visible = CountVisibleGpus(listed->second, gpus.installed);
    absl::StrAppend(&gpus.description, ", CUDA_VISIBLE_DEVICES=", listed->second);
  }
  return gpus;
}

bool IsProcessesPerNodeWord(absl::string_view value) {
  return value == "auto" || value == "gpu" || value == "cpu";
}

absl::StatusOr<int> ParseProcessesPerNode(const std::string& value, const GpuInventory& gpus) {
  if (value == "gpu") {
    if (gpus.visible > 0) return gpus.visible;
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc-per-node gpu: no NVIDIA GPU is visible here (", gpus.description,
                     "); give the number of workers instead, e.g. --nproc-per-node 2"));
  }
  if (value == "auto") return std::max(1, gpus.visible);
  if (value == "cpu") return 1;
  int count = 0;
  if (absl::SimpleAtoi(value, &count) && count > 0) return count;
  return absl::InvalidArgumentError(absl::StrCat(
      "--nproc-per-node ", value,
      ": give a positive number of workers, gpu for one per visible GPU, auto for that or 1 "
      "without a GPU, or cpu for 1"));
}

}  // namespace dtrain
