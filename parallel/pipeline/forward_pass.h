// One micro-batch forward through a pipeline without a schedule, for evaluation and sampling:
// model chunk k on stage k mod pp hands its output to model chunk k + 1 (schedule.h's
// placement), each stage running its chunks in turn.
#pragma once

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "core/backend/backend.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

// Runs `forward(chunk, input, output)` for each of the stage's `chunks` (0 .. chunks - 1, the
// same count on every stage of `pp`, group rank = stage) in model order: `input` is what the
// previous model chunk's stage sent (unread on model chunk 0), `output` (unwritten on the last
// model chunk) is sent on to the next, both `backend`'s memory. `count` values of `type` cross
// each boundary (0: nothing is sent).
// Every stage calls it together. Errors: a failed send or receive, as the communicator names it.
absl::Status ForwardThroughStages(
    Communicator& pp, Backend& backend, int chunks, size_t count, DataType type,
    const std::function<void(int chunk, ConstValues input, Values output)>& forward);

}  // namespace dtrain
