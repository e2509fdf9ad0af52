#include "parallel/pipeline/forward_pass.h"

#include "core/util/status.h"

namespace dtrain {

absl::Status ForwardThroughStages(
    Communicator& pp, Backend& backend, int chunks, size_t count,
    const std::function<void(int chunk, const float* input, float* output)>& forward) {
  const int stages = pp.size(), stage = pp.rank();
  const int previous = (stage + stages - 1) % stages, next = (stage + 1) % stages;
  const DeviceBuffer input = backend.Allocate(count), output = backend.Allocate(count);
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int model_chunk = chunk * stages + stage;
    if (model_chunk > 0 && count > 0) {
      RETURN_IF_ERROR(pp.Recv(input.floats(), count, previous)->Wait());
    }
    forward(chunk, input.floats(), output.floats());
    if (model_chunk + 1 < chunks * stages && count > 0) {
      RETURN_IF_ERROR(pp.Send(output.floats(), count, next)->Wait());
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain
