// The NCCL communicators of the mesh groups under a CUDA backend, made by the CUDA module
// (core/backend/cuda_module.h), which also holds the NCCL communicator: a second entry point of
// the same libdtrain_cuda.so, so that the binary links neither CUDA nor NCCL.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/backend/backend.h"
#include "parallel/comm/communicator.h"
#include "parallel/mesh.h"
#include "parallel/store/store.h"

namespace dtrain {

struct NcclModule {
  // An NCCL communicator for the mesh group `spec` on the GPU of `backend` (a CUDA backend the
  // module made): its collectives run on that backend's memory, each after the kernels issued on
  // the backend's stream before it. The group's rank 0 publishes NCCL's id in `store` under
  // spec.key_prefix; a member missing after `timeout` fails the call, named.
  absl::StatusOr<std::unique_ptr<Communicator>> (*create_communicator)(std::shared_ptr<Store> store,
                                                                       const GroupSpec& spec,
                                                                       absl::Duration timeout,
                                                                       Backend& backend);
};

// A module with another layout of NcclModule exports another name (_v2, ...).
inline constexpr char kNcclModuleEntry[] = "dtrain_nccl_module_v1";
extern "C" {
using NcclModuleEntry = const NcclModule* (*)();
}

// The module's NcclModule, once LoadCudaModule has checked the module is of this build; its
// errors otherwise.
absl::StatusOr<const NcclModule*> LoadNcclModule();

}  // namespace dtrain
