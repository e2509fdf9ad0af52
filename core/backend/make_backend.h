// The backend a run computes on, from run.device: the CPU backend, or the CUDA backend of the
// module the binary loads at run time (cuda_module.h) on the local rank's GPU.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/backend/backend.h"
#include "core/backend/matmul_precision.h"

namespace dtrain {

// Whether a worker at `local_rank` can compute on `device` (run.device), checked before anything
// is written so that a missing GPU is a usage error: OK for cpu; for cuda, the module loads and
// the node has a GPU for every local rank (one worker per GPU). FailedPrecondition otherwise.
absl::Status CheckDevice(absl::string_view device, int local_rank);

// `device` is run.device ("cpu" or "cuda"); `cpu_threads` is run.threads (CPU only);
// `local_rank` picks the GPU; `matmul_precision` is run.matmul_precision's. FailedPrecondition
// when CUDA is asked for and there is no module or no such GPU, saying which and why.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    absl::string_view device, int cpu_threads, int local_rank,
    MatmulPrecision matmul_precision = MatmulPrecision::kHighest);

// The first device error of `backend`, which MakeBackend(device, ...) made: a CUDA kernel or call
// that failed, named; always OK on the CPU. Device work is asynchronous, so callers check it
// where they can report it (the trainer: after every step).
absl::Status DeviceStatus(absl::string_view device, const Backend& backend);

}  // namespace dtrain
