#include "core/backend/cuda_module.h"

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// The module's file, opened once per process, and the fix every failure to use it names.
struct OpenedModule {
  void* handle = nullptr;  // stays open for the life of the process
  std::string path;
  std::string fix;
};

absl::StatusOr<OpenedModule> Open() {
  std::error_code error;
  const std::filesystem::path binary = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot find the CUDA module: /proc/self/exe does not name this binary (",
                     error.message(), ")"));
  }
  OpenedModule opened;
  opened.path = (binary.parent_path() / kCudaModuleFile).string();
  opened.fix = absl::StrCat("; install ", kCudaModuleFile, " from the same dtrain build beside ",
                            binary.string(),
                            " (a build with the CUDA toolkit makes it), or set run.device: cpu");
  if (!std::filesystem::exists(opened.path, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("run.device is cuda but ", opened.path, " does not exist", opened.fix));
  }
  // RTLD_NOW: a missing CUDA library or symbol fails here, naming itself, not at first use.
  opened.handle = dlopen(opened.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (opened.handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run.device is cuda but ", opened.path, " cannot be loaded: ", dlerror(), opened.fix));
  }
  return opened;
}

absl::StatusOr<const CudaModule*> Load() {
  ASSIGN_OR_RETURN(void* symbol, FindCudaModuleSymbol(kCudaModuleEntry));
  const CudaModule* module = reinterpret_cast<CudaModuleEntry>(symbol)();
  if (std::string(module->dtrain_version) != DTRAIN_VERSION) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run.device is cuda but ", kCudaModuleFile, " is from dtrain ", module->dtrain_version,
        " and this binary is dtrain ", DTRAIN_VERSION, "; install the module of the same build"));
  }
  return module;
}

}  // namespace

absl::StatusOr<int> GpuOfLocalRank(int local_rank, int visible_gpus,
                                   const char* cuda_visible_devices) {
  if (local_rank < visible_gpus) return local_rank;
  const std::string visible = cuda_visible_devices == nullptr ? "" : cuda_visible_devices;
  if (visible_gpus == 1 && !visible.empty() && visible.find(',') == std::string::npos) return 0;
  return absl::FailedPreconditionError(absl::StrCat(
      "local rank ", local_rank, " needs a GPU of its own but ", visible_gpus,
      " GPU(s) are visible to it",
      visible.empty() ? "" : absl::StrCat(" (CUDA_VISIBLE_DEVICES=", visible, ")"),
      "; start at most one worker per GPU (dtrain launch --nproc-per-node gpu), or bind one GPU "
      "to each (srun --gpus-per-task=1)"));
}

absl::StatusOr<void*> FindCudaModuleSymbol(const char* name) {
  static const absl::StatusOr<OpenedModule>* const opened =
      new absl::StatusOr<OpenedModule>(Open());
  if (!opened->ok()) return opened->status();
  void* symbol = dlsym((*opened)->handle, name);
  if (symbol == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("run.device is cuda but ", (*opened)->path, " has no entry point ", name,
                     ": it is from another dtrain version", (*opened)->fix));
  }
  return symbol;
}

absl::StatusOr<const CudaModule*> LoadCudaModule() {
  static const absl::StatusOr<const CudaModule*>* const module =
      new absl::StatusOr<const CudaModule*>(Load());
  return *module;
}

}  // namespace dtrain
