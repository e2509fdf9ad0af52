// The CUDA module's entry point for the NCCL communicators (parallel/comm/nccl_module.h).
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/backend/cuda/cuda_backend.h"
#include "parallel/comm/nccl/nccl_communicator.h"
#include "parallel/comm/nccl_module.h"

namespace dtrain {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(std::shared_ptr<Store> store,
                                                                 const GroupSpec& spec,
                                                                 absl::Duration timeout,
                                                                 Backend& backend) {
  const auto& cuda = static_cast<const CudaBackend&>(backend);
  // NCCL binds a communicator to the calling thread's current device.
  if (const cudaError_t error = cudaSetDevice(cuda.device()); error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice(", cuda.device(), ") for the ",
                                            spec.name, " group: ", cudaGetErrorString(error)));
  }
  NcclCommunicatorOptions options;
  options.name = spec.name;
  options.key_prefix = spec.key_prefix;
  options.rank = spec.rank;
  options.size = static_cast<int>(spec.world_ranks.size());
  options.world_ranks = spec.world_ranks;
  options.timeout = timeout;
  options.compute_stream = cuda.stream();
  options.point_to_point = spec.point_to_point;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> created =
      NcclCommunicator::Create(std::move(store), options);
  if (!created.ok()) return created.status();
  return std::unique_ptr<Communicator>(std::move(*created));
}

constexpr NcclModule kModule{.create_communicator = &CreateCommunicator};

}  // namespace
}  // namespace dtrain

extern "C" __attribute__((visibility("default"))) const dtrain::NcclModule*
dtrain_nccl_module_v1() {
  return &dtrain::kModule;
}
