#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// One compute step of a stage: a forward or a backward of (micro_batch, chunk).
struct Compute {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;
};

bool IsInterleaved(const PipelineShape& shape) {
  return shape.schedule == PipelineSchedule::kInterleaved && shape.virtual_stages > 1;
}

// The (micro_batch, chunk) of the k-th forward of every stage: Megatron-LM's schedule table.
// Micro-batches go in groups (InterleavedGroupSize); a group runs chunk 0 for each of its
// micro-batches, then chunk 1, and so on, so that when stage 0 starts chunk c + 1 of the
// group's first micro-batch, at least stages - 1 forwards later, the last stage has finished its
// chunk c. The last group holds what remains. Without interleaving this is micro-batch order.
// The k-th backward runs the same micro-batch on chunk virtual_stages - 1 - chunk: backward
// visits the chunks in reverse.
std::vector<std::pair<int, int>> ForwardTable(const PipelineShape& shape) {
  const int group = IsInterleaved(shape) ? InterleavedGroupSize(shape) : shape.micro_batches;
  std::vector<std::pair<int, int>> table;
  table.reserve(static_cast<size_t>(shape.micro_batches) * shape.virtual_stages);
  for (int first = 0; first < shape.micro_batches; first += group) {
    const int end = std::min(first + group, shape.micro_batches);
    for (int chunk = 0; chunk < shape.virtual_stages; ++chunk) {
      for (int micro_batch = first; micro_batch < end; ++micro_batch) {
        table.emplace_back(micro_batch, chunk);
      }
    }
  }
  return table;
}

std::vector<Compute> ComputeOrder(const PipelineShape& shape, int stage) {
  const std::vector<std::pair<int, int>> table = ForwardTable(shape);
  const int total = static_cast<int>(table.size());
  const int warmup = WarmupForwards(shape, stage);
  const auto forward = [&](int k) { return Compute{true, table[k].first, table[k].second}; };
  const auto backward = [&](int k) {
    return Compute{false, table[k].first, shape.virtual_stages - 1 - table[k].second};
  };
  std::vector<Compute> order;
  order.reserve(2 * static_cast<size_t>(total));
  for (int k = 0; k < warmup; ++k) order.push_back(forward(k));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(forward(warmup + k));
    order.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(backward(k));
  return order;
}

}  // namespace

absl::string_view PipelineScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(absl::string_view name) {
  for (PipelineSchedule schedule :
       {PipelineSchedule::kOneFOneB, PipelineSchedule::kInterleaved, PipelineSchedule::kGpipe}) {
    if (name == PipelineScheduleName(schedule)) return schedule;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "parallel.pp_schedule: '", name, "' is not a schedule; use 1f1b, interleaved or gpipe"));
}

absl::Status CheckPipelineShape(const PipelineShape& shape) {
  if (shape.stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pp = ", shape.stages, ": a pipeline needs at least 1 stage"));
  }
  if (shape.virtual_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pp_virtual_stages = ", shape.virtual_stages,
                     ": every stage holds at least 1 chunk"));
  }
  if (shape.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.micro_batches,
                     " micro-batches per step: a step needs at least one; raise "
                     "train.batch_size or lower train.micro_batch"));
  }
  if (shape.virtual_stages > 1 && shape.schedule != PipelineSchedule::kInterleaved) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.pp_virtual_stages = ", shape.virtual_stages,
        " needs parallel.pp_schedule: interleaved (it is ", PipelineScheduleName(shape.schedule),
        "); set pp_schedule: interleaved, or pp_virtual_stages: 1"));
  }
  return absl::OkStatus();
}

std::string FormatAction(const PipelineAction& action) {
  const std::string id = absl::StrCat(action.micro_batch, ".", action.chunk);
  switch (action.kind) {
    case PipelineActionKind::kRecvForward:
      return absl::StrCat("recvF", id, "<-", action.peer);
    case PipelineActionKind::kForward:
      return absl::StrCat("F", id);
    case PipelineActionKind::kSendForward:
      return absl::StrCat("sendF", id, "->", action.peer);
    case PipelineActionKind::kRecvBackward:
      return absl::StrCat("recvB", id, "<-", action.peer);
    case PipelineActionKind::kBackward:
      return absl::StrCat("B", id);
    case PipelineActionKind::kSendBackward:
      return absl::StrCat("sendB", id, "->", action.peer);
  }
  return "?";
}

int InterleavedGroupSize(const PipelineShape& shape) {
  const int p = shape.stages, m = shape.micro_batches;
  if (m < p) return m;
  for (int group = p;; ++group) {
    const int remainder = m % group;
    if (remainder == 0 || remainder >= p) return group;
  }
}

int WarmupForwards(const PipelineShape& shape, int stage) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.virtual_stages;
  switch (shape.schedule) {
    case PipelineSchedule::kGpipe:
      return m * v;
    case PipelineSchedule::kOneFOneB:
      return std::min(m, p - stage - 1);
    case PipelineSchedule::kInterleaved:
      if (v == 1) return std::min(m, p - stage - 1);
      return std::min(m * v, 2 * (p - stage - 1) + (v - 1) * InterleavedGroupSize(shape));
  }
  return 0;
}

absl::StatusOr<std::vector<PipelineAction>> StageActions(const PipelineShape& shape, int stage) {
  if (absl::Status status = CheckPipelineShape(shape); !status.ok()) return status;
  const int p = shape.stages;
  if (stage < 0 || stage >= p) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", stage, " is outside a pipeline of ", p, " stages"));
  }
  // Model chunk chunk * p + s receives from model chunk - 1 and sends to model chunk + 1, which
  // sit on the neighbouring stages (the first and the last stage are neighbours between chunks);
  // there is nothing to move when both are on one stage.
  const int last_model_chunk = p * shape.virtual_stages - 1;
  const auto previous = [p](int s) { return (s + p - 1) % p; };
  const auto next = [p](int s) { return (s + 1) % p; };
  const auto has_previous = [p](int model_chunk) { return p > 1 && model_chunk > 0; };
  const auto has_next = [&](int model_chunk) { return p > 1 && model_chunk < last_model_chunk; };

  // What each neighbour sends this stage, in the neighbour's order: this stage posts its
  // receives from a peer in that order (the communicator matches per peer in order). With two
  // stages and interleaving, one peer sends both activations and gradients, and this stage needs
  // them in another order than they are sent: a receive is then posted early, when the compute
  // that needs it comes after one that needs a later message from the same peer.
  std::vector<std::vector<PipelineAction>> incoming(p);
  for (int peer : {previous(stage), next(stage)}) {
    if (peer == stage || !incoming[peer].empty()) continue;
    for (const Compute& c : ComputeOrder(shape, peer)) {
      const int model_chunk = c.chunk * p + peer;
      if (c.forward && has_next(model_chunk) && next(peer) == stage) {
        incoming[peer].push_back(
            {PipelineActionKind::kRecvForward, c.micro_batch, (model_chunk + 1) / p, peer});
      }
      if (!c.forward && has_previous(model_chunk) && previous(peer) == stage) {
        incoming[peer].push_back(
            {PipelineActionKind::kRecvBackward, c.micro_batch, (model_chunk - 1) / p, peer});
      }
    }
  }
  std::vector<size_t> posted(p, 0);  // per peer: receives listed so far
  std::vector<PipelineAction> actions;
  // Lists the receives from `peer` up to the one `needed`, unless it already is.
  const auto post_through = [&](const PipelineAction& needed) -> absl::Status {
    const std::vector<PipelineAction>& from = incoming[needed.peer];
    if (std::find(from.begin(), from.begin() + posted[needed.peer], needed) !=
        from.begin() + posted[needed.peer]) {
      return absl::OkStatus();
    }
    while (posted[needed.peer] < from.size()) {
      actions.push_back(from[posted[needed.peer]++]);
      if (actions.back() == needed) return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat("pipeline schedule: stage ", needed.peer,
                                            " never sends ", FormatAction(needed)));
  };
  for (const Compute& c : ComputeOrder(shape, stage)) {
    const int model_chunk = c.chunk * p + stage;
    const auto action = [&](PipelineActionKind kind, int peer) -> PipelineAction {
      return {kind, c.micro_batch, c.chunk, peer};
    };
    if (c.forward) {
      if (has_previous(model_chunk)) {
        if (absl::Status status =
                post_through(action(PipelineActionKind::kRecvForward, previous(stage)));
            !status.ok()) {
          return status;
        }
      }
      actions.push_back(action(PipelineActionKind::kForward, -1));
      if (has_next(model_chunk))
        actions.push_back(action(PipelineActionKind::kSendForward, next(stage)));
    } else {
      if (has_next(model_chunk)) {
        if (absl::Status status =
                post_through(action(PipelineActionKind::kRecvBackward, next(stage)));
            !status.ok()) {
          return status;
        }
      }
      actions.push_back(action(PipelineActionKind::kBackward, -1));
      if (has_previous(model_chunk)) {
        actions.push_back(action(PipelineActionKind::kSendBackward, previous(stage)));
      }
    }
  }
  return actions;
}

}  // namespace dtrain
