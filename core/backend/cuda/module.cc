// The CUDA module's entry point (core/backend/cuda_module.h): the one symbol the binary looks up.
#include <memory>

#include "core/backend/cuda/cuda_backend.h"
#include "core/backend/cuda_module.h"

namespace dtrain {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(int device,
                                                       MatmulPrecision matmul_precision) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
      CudaBackend::Create(device, matmul_precision);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(std::move(*backend));
}

absl::Status DeviceStatus(const Backend& backend) {
  return static_cast<const CudaBackend&>(backend).status();
}

absl::Status CheckDevice(int device) { return CudaBackend::CheckDevice(device); }

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
