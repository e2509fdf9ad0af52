#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

using Kind = PipelineActionKind;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

bool IsRecv(Kind kind) { return kind == Kind::kRecvForward || kind == Kind::kRecvBackward; }
bool IsSend(Kind kind) { return kind == Kind::kSendForward || kind == Kind::kSendBackward; }

}  // namespace

void PipelineStepTimes::Add(const PipelineExecutorStats& stats) {
  ++steps;
  step_ms += stats.step_ms;
  compute_ms += stats.compute_ms;
  wait_ms += stats.wait_ms;
}

std::string PipelineStepTimes::Format() const {
  return absl::StrFormat("waited %.1f ms of %.1f ms (%.1f%%) in %d steps, computing %.1f ms",
                         wait_ms, step_ms, step_ms > 0 ? 100 * wait_ms / step_ms : 0.0, steps,
                         compute_ms);
}

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    const PipelineShape& shape, int stage, Communicator* comm, Backend& backend) {
  absl::StatusOr<std::vector<PipelineAction>> actions = StageActions(shape, stage);
  if (!actions.ok()) return actions.status();
  if (shape.stages > 1 &&
      (comm == nullptr || comm->size() != shape.stages || comm->rank() != stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", stage, " of ", shape.stages, ": the pipeline group needs ",
                     shape.stages, " ranks with this stage at rank ", stage, ", but ",
                     comm == nullptr ? std::string("there is no communicator")
                                     : absl::StrCat("group '", comm->name(), "' has ", comm->size(),
                                                    " ranks and this is rank ", comm->rank())));
  }
  return std::unique_ptr<PipelineExecutor>(
      new PipelineExecutor(shape, stage, comm, backend, *std::move(actions)));
}

PipelineExecutor::PipelineExecutor(const PipelineShape& shape, int stage, Communicator* comm,
                                   Backend& backend, std::vector<PipelineAction> actions)
    : shape_(shape), stage_(stage), comm_(comm), backend_(backend), actions_(std::move(actions)) {
  const int p = shape.stages;
  send_safe_after_.resize(p);
  sends_.resize(p);
  recvs_posted_.assign(p, 0);
  recvs_completed_.assign(p, 0);
  sends_posted_.assign(p, 0);
  // For each send to a neighbour: where, in the neighbour's own list, it posts the matching
  // receive (its n-th receive from this stage matches this stage's n-th send), and which of its
  // sends back to this stage it lists after that. Once that message has arrived here, the
  // neighbour has posted the receive, and waiting for the send cannot block on it.
  for (int peer = 0; peer < p; ++peer) {
    const bool neighbour =
        std::any_of(actions_.begin(), actions_.end(),
                    [peer](const PipelineAction& a) { return IsSend(a.kind) && a.peer == peer; });
    if (!neighbour) continue;
    // StageActions cannot fail for a stage of a shape it accepted.
    const std::vector<PipelineAction> theirs = *StageActions(shape, peer);
    int sends_back = 0;
    for (const PipelineAction& a : theirs) {
      if (IsRecv(a.kind) && a.peer == stage) send_safe_after_[peer].push_back(sends_back);
      if (IsSend(a.kind) && a.peer == stage) ++sends_back;
    }
    for (int& ordinal : send_safe_after_[peer]) {
      if (ordinal >= sends_back) ordinal = std::numeric_limits<int>::max();
    }
  }
}

PipelineExecutor::~PipelineExecutor() { Abandon(); }

PipelineExecutor::Buffer PipelineExecutor::Acquire(size_t count, DataType type) {
  Buffer buffer;
  // The smallest pooled buffer that holds `count` avoids a reallocation; any other grows. (A
  // step's buffers are all of one type.)
  auto best = pool_.end();
  for (auto it = pool_.begin(); it != pool_.end(); ++it) {
    const size_t capacity = it->memory.dtype() == type ? it->memory.size() : 0;
    if (capacity >= count && (best == pool_.end() || capacity < best->memory.size())) best = it;
  }
  if (best == pool_.end() && !pool_.empty()) best = pool_.begin();
  if (best != pool_.end()) {
    buffer = std::move(*best);
    pool_.erase(best);
  } else {
    ++stats_.buffers_allocated;
  }
  if (buffer.memory.size() < count || buffer.memory.dtype() != type) {
    buffer.memory = backend_.Allocate(count, type);
  }
  buffer.count = count;
  stats_.peak_buffers_in_use = std::max(stats_.peak_buffers_in_use, ++in_use_);
  in_use_bytes_ += count * DataTypeBytes(type);
  stats_.peak_buffer_bytes = std::max(stats_.peak_buffer_bytes, in_use_bytes_);
  return buffer;
}

void PipelineExecutor::Release(Buffer buffer) {
  --in_use_;
  in_use_bytes_ -= buffer.count * DataTypeBytes(buffer.memory.dtype());
  pool_.push_back(std::move(buffer));
}

absl::Status PipelineFailure(const absl::Status& cause, int stage, int stages,
                             const Communicator* comm, absl::string_view what, bool send,
                             int peer) {
  std::string where = absl::StrCat("pipeline stage ", stage, " of ", stages);
  if (comm != nullptr) absl::StrAppend(&where, " on group '", comm->name(), "'");
  const std::string to = peer >= 0 ? absl::StrCat(send ? " to stage " : " from stage ", peer) : "";
  return Renamed(cause, absl::StrCat(where, ": ", what, to, " failed: ", cause.message()));
}

absl::Status PipelineExecutor::Failed(const PipelineAction& action,
                                      const absl::Status& cause) const {
  return PipelineFailure(cause, stage_, shape_.stages, comm_, FormatAction(action),
                         IsSend(action.kind), action.peer);
}

void PipelineExecutor::PostRecv(const PipelineAction& action, size_t count, DataType type,
                                std::map<Key, Slot>& into) {
  Slot slot;
  slot.buffer = Acquire(count, type);
  slot.work = comm_->Recv(slot.buffer.memory.data(), count, type, action.peer);
  slot.action = action;
  slot.ordinal = recvs_posted_[action.peer]++;
  into[{action.micro_batch, action.chunk}] = std::move(slot);
}

absl::Status PipelineExecutor::PostSend(const PipelineAction& action, std::map<Key, Slot>& from) {
  auto it = from.find({action.micro_batch, action.chunk});
  if (it == from.end()) {
    return Failed(action, absl::InternalError("the schedule sends what no compute produced"));
  }
  Slot slot = std::move(it->second);
  from.erase(it);
  slot.work = comm_->Send(slot.buffer.memory.data(), slot.buffer.count, slot.buffer.memory.dtype(),
                          action.peer);
  slot.action = action;
  slot.ordinal = sends_posted_[action.peer]++;
  sends_[action.peer].push_back(std::move(slot));
  return absl::OkStatus();
}

absl::Status PipelineExecutor::ReclaimSends(int peer, bool all) {
  std::vector<Slot>& pending = sends_[peer];
  size_t done = 0;
  absl::Status status;
  for (; done < pending.size(); ++done) {
    Slot& send = pending[done];
    if (!all && send_safe_after_[peer][send.ordinal] >= recvs_completed_[peer]) break;
    status = TimedWait(*send.work);
    send.work.reset();
    if (!status.ok()) {
      status = Failed(send.action, status);
      break;
    }
    Release(std::move(send.buffer));
  }
  if (status.ok()) pending.erase(pending.begin(), pending.begin() + done);
  return status;
}

absl::Status PipelineExecutor::TimedWait(Work& work) {
  const Clock::time_point start = Clock::now();
  absl::Status status = work.Wait();
  wait_time_ += Clock::now() - start;
  return status;
}

absl::Status PipelineExecutor::WaitRecv(Slot& slot) {
  if (slot.work == nullptr) return absl::OkStatus();
  absl::Status status = TimedWait(*slot.work);
  slot.work.reset();
  if (!status.ok()) return Failed(slot.action, status);
  const int peer = slot.action.peer;
  recvs_completed_[peer] = std::max(recvs_completed_[peer], slot.ordinal + 1);
  return ReclaimSends(peer, /*all=*/false);
}

absl::Status PipelineExecutor::RunForward(const PipelineAction& action, PipelineStage& stage) {
  const int p = shape_.stages;
  const int model_chunk = action.chunk * p + stage_;
  const Key key{action.micro_batch, action.chunk};
  ConstValues input;
  if (model_chunk > 0) {
    auto it = inputs_.find(key);
    if (it == inputs_.end()) {
      return Failed(action, absl::InternalError("the schedule never received its input"));
    }
    if (absl::Status status = WaitRecv(it->second); !status.ok()) return status;
    input = it->second.buffer.data();
  }
  const bool last = model_chunk == p * shape_.virtual_stages - 1;
  Buffer output;
  if (!last) output = Acquire(stage.OutputCount(action.chunk), stage.ActivationType());
  const Clock::time_point start = Clock::now();
  absl::Status status =
      stage.Forward(action.micro_batch, action.chunk, input, last ? Values() : output.data());
  compute_time_ += Clock::now() - start;
  if (!status.ok()) {
    if (!last) Release(std::move(output));
    return Failed(action, status);
  }
  stats_.peak_live_activations = std::max(stats_.peak_live_activations, ++live_);
  if (last) return absl::OkStatus();
  Slot slot;
  slot.buffer = std::move(output);
  // One stage: the next model chunk is here, and takes the output as its input directly.
  if (p == 1) {
    inputs_[{action.micro_batch, action.chunk + 1}] = std::move(slot);
  } else {
    to_send_[key] = std::move(slot);
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::RunBackward(const PipelineAction& action, PipelineStage& stage) {
  const int p = shape_.stages;
  const int model_chunk = action.chunk * p + stage_;
  const Key key{action.micro_batch, action.chunk};
  const bool last = model_chunk == p * shape_.virtual_stages - 1;
  ConstValues d_output;
  if (!last) {
    auto it = d_outputs_.find(key);
    if (it == d_outputs_.end()) {
      return Failed(action,
                    absl::InternalError("the schedule never received its output's gradient"));
    }
    if (absl::Status status = WaitRecv(it->second); !status.ok()) return status;
    d_output = it->second.buffer.data();
  }
  Buffer d_input;
  if (model_chunk > 0) d_input = Acquire(stage.InputCount(action.chunk), stage.ActivationType());
  const Clock::time_point start = Clock::now();
  absl::Status status = stage.Backward(action.micro_batch, action.chunk, d_output,
                                       model_chunk > 0 ? d_input.data() : Values());
  compute_time_ += Clock::now() - start;
  if (!status.ok()) {
    if (model_chunk > 0) Release(std::move(d_input));
    return Failed(action, status);
  }
  --live_;
  // The input was kept for this backward, and the output's gradient was only needed here.
  for (std::map<Key, Slot>* done : {&inputs_, &d_outputs_}) {
    auto it = done->find(key);
    if (it == done->end()) continue;
    Release(std::move(it->second.buffer));
    done->erase(it);
  }
  if (model_chunk == 0) return absl::OkStatus();
  Slot slot;
  slot.buffer = std::move(d_input);
  if (p == 1) {
    d_outputs_[{action.micro_batch, action.chunk - 1}] = std::move(slot);
  } else {
    to_send_[key] = std::move(slot);
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::RunAction(const PipelineAction& action, PipelineStage& stage) {
  switch (action.kind) {
    case Kind::kRecvForward:
      PostRecv(action, stage.InputCount(action.chunk), stage.ActivationType(), inputs_);
      return absl::OkStatus();
    case Kind::kRecvBackward:
      PostRecv(action, stage.OutputCount(action.chunk), stage.ActivationType(), d_outputs_);
      return absl::OkStatus();
    case Kind::kForward:
      return RunForward(action, stage);
    case Kind::kBackward:
      return RunBackward(action, stage);
    case Kind::kSendForward:
    case Kind::kSendBackward:
      return PostSend(action, to_send_);
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::RunStep(PipelineStage& stage) {
  const Clock::time_point start = Clock::now();
  compute_time_ = wait_time_ = Clock::duration::zero();
  std::fill(recvs_posted_.begin(), recvs_posted_.end(), 0);
  std::fill(recvs_completed_.begin(), recvs_completed_.end(), 0);
  std::fill(sends_posted_.begin(), sends_posted_.end(), 0);
  live_ = 0;
  stats_.peak_live_activations = 0;
  stats_.peak_buffers_in_use = 0;
  stats_.peak_buffer_bytes = 0;
  absl::Status status;
  for (const PipelineAction& action : actions_) {
    status = RunAction(action, stage);
    if (!status.ok()) break;
  }
  for (int peer = 0; peer < shape_.stages && status.ok(); ++peer) {
    status = ReclaimSends(peer, /*all=*/true);
  }
  stats_.step_ms = Ms(Clock::now() - start);
  stats_.compute_ms = Ms(compute_time_);
  stats_.wait_ms = Ms(wait_time_);
  if (!status.ok()) {
    Abandon();
    return status;
  }
  if (!inputs_.empty() || !d_outputs_.empty() || !to_send_.empty()) {
    Abandon();
    return absl::InternalError(absl::StrCat("pipeline stage ", stage_,
                                            ": the schedule left buffers unconsumed at the end of "
                                            "the step"));
  }
  return absl::OkStatus();
}

void PipelineExecutor::Abandon() {
  // Destroying a Slot waits for its operation before its buffer goes (Slot's member order).
  inputs_.clear();
  d_outputs_.clear();
  to_send_.clear();
  for (std::vector<Slot>& pending : sends_) pending.clear();
  in_use_ = 0;
  in_use_bytes_ = 0;
}

}  // namespace dtrain
