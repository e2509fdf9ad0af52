#include "core/backend/make_backend.h"

#include "absl/strings/str_cat.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/backend/cpu/gemm.h"
#include "core/backend/cuda_module.h"
#include "core/util/status.h"

namespace dtrain {

absl::Status CheckDevice(absl::string_view device, int local_rank) {
  if (device != "cuda") return absl::OkStatus();
  ASSIGN_OR_RETURN(const CudaModule* module, LoadCudaModule());
  return module->check_device(local_rank);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view device, int cpu_threads,
                                                     int local_rank,
                                                     MatmulPrecision matmul_precision) {
  if (device == "cpu") {
    // run.threads bounds OpenBLAS's GEMMs too (`dtrain launch` sets it to the node's cores over
    // its workers); 0 leaves them OpenBLAS's own count (every core, or OPENBLAS_NUM_THREADS).
    if (cpu_threads > 0) cpu::SetBlasThreads(cpu_threads);
    return std::make_unique<CpuBackend>(cpu_threads, matmul_precision);
  }
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("run.device '", device, "' is not a device; set cpu or cuda"));
  }
  ASSIGN_OR_RETURN(const CudaModule* module, LoadCudaModule());
  return module->create_backend(local_rank, matmul_precision);
}

absl::Status DeviceStatus(absl::string_view device, const Backend& backend) {
  if (device != "cuda") return absl::OkStatus();
  ASSIGN_OR_RETURN(const CudaModule* module, LoadCudaModule());
  return module->device_status(backend);
}

}  // namespace dtrain
