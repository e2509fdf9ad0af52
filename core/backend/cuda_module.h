// The CUDA side of dtrain lives in a shared module, libdtrain_cuda.so (the CUDA backend, its
// kernels, cuBLASLt and NCCL), built with the toolkit and installed beside the binary. The binary
// links none of CUDA's libraries, so it starts and trains on CPU on a machine without a GPU or
// driver; it loads the module only when a run asks for CUDA. The module's code uses the binary's
// own symbols (the binary exports them), so both must come from the same build: the entry point
// is versioned and the module states the dtrain version it was built for.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "core/backend/backend.h"
#include "core/backend/matmul_precision.h"

namespace dtrain {

// What the module hands back: factories over its C++ types. Binary and module are compiled from
// the same headers, so C++ types cross the boundary unchanged.
struct CudaModule {
  const char* dtrain_version;  // DTRAIN_VERSION the module was built with
  // OK when the worker at `local_rank` has a GPU (GpuOfLocalRank), without starting it; else
  // why not, as create_backend says.
  absl::Status (*check_device)(int local_rank);
  // The CUDA backend on the GPU of the worker at `local_rank` (GpuOfLocalRank), its GEMMs at
  // `matmul_precision`. An error says why there is no such GPU (no driver, no device, fewer
  // devices than local ranks).
  absl::StatusOr<std::unique_ptr<Backend>> (*create_backend)(int local_rank,
                                                             MatmulPrecision matmul_precision);
  // The first device error of a backend create_backend made (a failed kernel, named), or OK.
  absl::Status (*device_status)(const Backend& backend);
};

// The module's file name and the exported symbol of a function returning the CudaModule. A
// module with another layout of CudaModule exports another name (_v2, ...).
inline constexpr char kCudaModuleFile[] = "libdtrain_cuda.so";
inline constexpr char kCudaModuleEntry[] = "dtrain_cuda_module_v2";
extern "C" {
using CudaModuleEntry = const CudaModule* (*)();
}

// Loads the module from the folder of the running binary (/proc/self/exe) once per process; later
// calls return the same module or the same error. FailedPrecondition naming the file and the
// loader's reason (dlerror) when it is absent, cannot load (a CUDA library missing) or is from
// another build.
absl::StatusOr<const CudaModule*> LoadCudaModule();

// The GPU (an index among the visible ones) the worker at `local_rank` computes on: its local
// rank, one worker per GPU; or, where its launcher made exactly one GPU visible to it
// (`cuda_visible_devices`, CUDA_VISIBLE_DEVICES or null, names one device: Slurm's
// --gpus-per-task=1, a container of one GPU), that one. FailedPrecondition naming the counts and
// the fix when the local rank has no GPU of its own.
absl::StatusOr<int> GpuOfLocalRank(int local_rank, int visible_gpus,
                                   const char* cuda_visible_devices);

// Another entry point of the same module, loaded as LoadCudaModule loads it (the NCCL
// communicators', parallel/comm/nccl_module.h, which this layer does not know); an error names
// the file and the fix.
absl::StatusOr<void*> FindCudaModuleSymbol(const char* name);

}  // namespace dtrain
