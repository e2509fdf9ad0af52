#include "parallel/pipeline/forward_pass.h"

#include "core/util/status.h"

namespace dtrain {

absl::Status ForwardThroughStages(
    Communicator& pp, Backend& backend, int chunks, size_t count, DataType type,
    const std::function<void(int chunk, ConstValues input, Values output)>& forward) {
  const int stages = pp.size(), stage = pp.rank();
  const int previous = (stage + stages - 1) % stages, next = (stage + 1) % stages;
  const DeviceBuffer input = backend.Allocate(count, type), output = backend.Allocate(count, type);
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int model_chunk = chunk * stages + stage;
    if (model_chunk > 0 && count > 0) {
      RETURN_IF_ERROR(pp.Recv(input.data(), count, type, previous)->Wait());
    }
    forward(chunk, input.values(), output.values());
    if (model_chunk + 1 < chunks * stages && count > 0) {
      RETURN_IF_ERROR(pp.Send(output.data(), count, type, next)->Wait());
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain
