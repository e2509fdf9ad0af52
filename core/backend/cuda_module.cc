#include "core/backend/cuda_module.h"

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

absl::StatusOr<const CudaModule*> Load() {
  std::error_code error;
  const std::filesystem::path binary = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot find the CUDA module: /proc/self/exe does not name this binary (",
                     error.message(), ")"));
  }
  const std::string path = (binary.parent_path() / kCudaModuleFile).string();
  const std::string fix = absl::StrCat(
      "; install ", kCudaModuleFile, " from the same dtrain build beside ", binary.string(),
      " (a build with the CUDA toolkit makes it), or set run.device: cpu");
  if (!std::filesystem::exists(path, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("run.device is cuda but ", path, " does not exist", fix));
  }
  // RTLD_NOW: a missing CUDA library or symbol fails here, naming itself, not at first use.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("run.device is cuda but ", path, " cannot be loaded: ", dlerror(), fix));
  }
  auto entry = reinterpret_cast<CudaModuleEntry>(dlsym(handle, kCudaModuleEntry));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("run.device is cuda but ", path,
                                                      " has no entry point ", kCudaModuleEntry,
                                                      ": it is from another dtrain version", fix));
  }
  const CudaModule* module = entry();
  if (std::string(module->dtrain_version) != DTRAIN_VERSION) {
    return absl::FailedPreconditionError(
        absl::StrCat("run.device is cuda but ", path, " is from dtrain ", module->dtrain_version,
                     " and this binary is dtrain ", DTRAIN_VERSION, fix));
  }
  return module;  // the handle stays open for the life of the process
}

}  // namespace

absl::StatusOr<const CudaModule*> LoadCudaModule() {
  static const absl::StatusOr<const CudaModule*>* const module =
      new absl::StatusOr<const CudaModule*>(Load());
  return *module;
}

}  // namespace dtrain
