// The CUDA module's backend entry point (core/backend/cuda_module.h); the NCCL communicators' is
// parallel/comm/nccl/module.cc.
#include <cstdlib>
#include <memory>

#include "core/backend/cuda/cuda_backend.h"
#include "core/backend/cuda_module.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// The GPU of the worker at `local_rank` (GpuOfLocalRank), or why there is none.
absl::StatusOr<int> DeviceOfLocalRank(int local_rank) {
  RETURN_IF_ERROR(CudaBackend::CheckDevice(0));  // any GPU at all, else why not
  int visible = 0;
  cudaGetDeviceCount(&visible);
  return GpuOfLocalRank(local_rank, visible, std::getenv("CUDA_VISIBLE_DEVICES"));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(int local_rank,
                                                       MatmulPrecision matmul_precision) {
  ASSIGN_OR_RETURN(const int device, DeviceOfLocalRank(local_rank));
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
      CudaBackend::Create(device, matmul_precision);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(std::move(*backend));
}

absl::Status DeviceStatus(const Backend& backend) {
  return static_cast<const CudaBackend&>(backend).status();
}

absl::Status CheckDevice(int local_rank) { return DeviceOfLocalRank(local_rank).status(); }

constexpr CudaModule kModule{.dtrain_version = DTRAIN_VERSION,
                             .check_device = &CheckDevice,
                             .create_backend = &CreateBackend,
                             .device_status = &DeviceStatus};

}  // namespace
}  // namespace dtrain

extern "C" __attribute__((visibility("default"))) const dtrain::CudaModule*
dtrain_cuda_module_v2() {
  return &dtrain::kModule;
}
