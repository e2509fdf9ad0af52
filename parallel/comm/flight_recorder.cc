#include "parallel/comm/flight_recorder.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/util/log.h"
#include "nlohmann/json.hpp"

namespace dtrain {
namespace {

constexpr char kFaultVariable[] = "DTRAIN_TEST_COLLECTIVE_FAULT";

std::atomic<bool> dump_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void OnDumpSignal(int) { dump_requested.store(true); }

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// The fault of DTRAIN_TEST_COLLECTIVE_FAULT, read once per process.
const std::optional<CollectiveFault>& TestFault() {
  static const std::optional<CollectiveFault> fault = []() -> std::optional<CollectiveFault> {
    const char* text = std::getenv(kFaultVariable);
    if (text == nullptr) return std::nullopt;
    absl::StatusOr<CollectiveFault> parsed = ParseCollectiveFault(text);
    if (!parsed.ok()) {
      LogWarn("%s ignored: %s", kFaultVariable, parsed.status().message());
      return std::nullopt;
    }
    return *parsed;
  }();
  return fault;
}

// Marks its record when the operation's outcome is known.
class RecordedWork : public Work {
 public:
  RecordedWork(std::unique_ptr<Work> inner, std::shared_ptr<FlightRecorder> recorder, uint64_t id)
      : inner_(std::move(inner)), recorder_(std::move(recorder)), id_(id) {}
  ~RecordedWork() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    absl::Status status = inner_->Wait();
    if (!finished_) {
      recorder_->Finish(id_, status.ok());
      finished_ = true;
    }
    return status;
  }
  // The record finishes at Wait, when the outcome is known.
  absl::Status WaitOnDevice() override { return inner_->WaitOnDevice(); }

 private:
  std::unique_ptr<Work> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t id_;
  bool finished_ = false;
};

class RecordingCommunicator : public Communicator {
 public:
  RecordingCommunicator(std::shared_ptr<FlightRecorder> recorder,
                        std::unique_ptr<Communicator> inner, std::vector<int> world_ranks)
      : recorder_(std::move(recorder)), inner_(std::move(inner)), members_(std::move(world_ranks)) {
    if (members_.empty()) {
      for (int r = 0; r < inner_->size(); ++r) members_.push_back(r);
    }
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Broadcast;
  using Communicator::Recv;
  using Communicator::ReduceScatter;
  using Communicator::Send;

  std::unique_ptr<Work> AllReduce(void* data, size_t count, DataType type, ReduceOp op) override {
    // A rejected reduction is never issued and takes no sequence number, as in the backends.
    if (!CheckReduction(type, op, "all_reduce", name()).ok()) {
      return inner_->AllReduce(data, count, type, op);
    }
    const FlightRecord record = Collective("all_reduce", count, type);
    if (const std::optional<CollectiveFault>& fault = TestFault();
        fault && !fault_fired_ && fault->rank == members_[rank()] && fault->group == name() &&
        record.seq >= fault->seq) {
      fault_fired_ = true;
      if (fault->skip) return FinishedWork(absl::OkStatus());
      if (count > 0) --count;
      return Issue(Collective("all_reduce", count, type, record.seq),
                   [&] { return inner_->AllReduce(data, count, type, op); });
    }
    return Issue(record, [&] { return inner_->AllReduce(data, count, type, op); });
  }
  std::unique_ptr<Work> ReduceScatter(const void* input, void* output, size_t count, DataType type,
                                      ReduceOp op) override {
    if (!CheckReduction(type, op, "reduce_scatter", name()).ok()) {
      return inner_->ReduceScatter(input, output, count, type, op);
    }
    return Issue(Collective("reduce_scatter", count, type),
                 [&] { return inner_->ReduceScatter(input, output, count, type, op); });
  }
  std::unique_ptr<Work> AllGather(const void* input, void* output, size_t count,
                                  DataType type) override {
    return Issue(Collective("all_gather", count, type),
                 [&] { return inner_->AllGather(input, output, count, type); });
  }
  std::unique_ptr<Work> Broadcast(void* data, size_t count, DataType type, int root) override {
    return Issue(Collective("broadcast", count, type),
                 [&] { return inner_->Broadcast(data, count, type, root); });
  }
  std::unique_ptr<Work> Send(const void* data, size_t count, DataType type, int peer) override {
    return Issue(PointToPoint("send", count, type, peer),
                 [&] { return inner_->Send(data, count, type, peer); });
  }
  std::unique_ptr<Work> Recv(void* data, size_t count, DataType type, int peer) override {
    return Issue(PointToPoint("recv", count, type, peer),
                 [&] { return inner_->Recv(data, count, type, peer); });
  }
  absl::Status Barrier() override {
    DumpIfAsked();
    const uint64_t id = recorder_->Record(Collective("barrier", 0, DataType::kF32));
    absl::Status status = inner_->Barrier();
    recorder_->Finish(id, status.ok());
    return status;
  }
  CommStats stats() const override { return inner_->stats(); }
  const Communicator& counted() const override { return inner_->counted(); }
  double TakeDeviceWaitMs() override { return inner_->TakeDeviceWaitMs(); }

 private:
  FlightRecord Collective(const char* op, size_t count, DataType type, int64_t seq = 0) {
    FlightRecord record = Base(op, count, type);
    record.seq = seq > 0 ? seq : ++collective_seq_;
    return record;
  }
  FlightRecord PointToPoint(const char* op, size_t count, DataType type, int peer) {
    FlightRecord record = Base(op, count, type);
    record.seq = ++point_to_point_seq_;
    record.peer = peer >= 0 && peer < size() ? members_[peer] : peer;
    return record;
  }
  FlightRecord Base(const char* op, size_t count, DataType type) const {
    FlightRecord record;
    record.group = name();
    record.members = members_;
    record.op = op;
    record.count = static_cast<int64_t>(count);
    record.type = type;
    record.bytes = static_cast<int64_t>(count * DataTypeBytes(type));
    return record;
  }

  template <typename IssueFn>
  std::unique_ptr<Work> Issue(FlightRecord record, IssueFn issue) {
    DumpIfAsked();
    const uint64_t id = recorder_->Record(std::move(record));
    return std::make_unique<RecordedWork>(issue(), recorder_, id);
  }

  void DumpIfAsked() {
    if (!dump_requested.exchange(false)) return;
    absl::StatusOr<std::string> path = recorder_->Dump("SIGUSR2");
    if (path.ok()) {
      LogInfo("flight recorder dumped to %s (SIGUSR2)", *path);
    } else {
      LogWarn("flight recorder: %s", path.status().message());
    }
  }

  const std::shared_ptr<FlightRecorder> recorder_;
  const std::unique_ptr<Communicator> inner_;
  std::vector<int> members_;
  int64_t collective_seq_ = 0;
  int64_t point_to_point_seq_ = 0;
  bool fault_fired_ = false;
};

}  // namespace

const char* FlightStateName(FlightState state) {
  switch (state) {
    case FlightState::kStarted:
      return "started";
    case FlightState::kCompleted:
      return "completed";
    case FlightState::kFailed:
      return "failed";
  }
  return "started";
}

std::string FlightRecordJson(const FlightRecord& record) {
  const nlohmann::json line = {{"group", record.group},
                               {"members", record.members},
                               {"seq", record.seq},
                               {"op", record.op},
                               {"count", record.count},
                               {"dtype", DataTypeName(record.type)},
                               {"bytes", record.bytes},
                               {"peer", record.peer},
                               {"start_us", record.start_us},
                               {"end_us", record.end_us},
                               {"state", FlightStateName(record.state)}};
  return line.dump();
}

absl::StatusOr<FlightRecord> ParseFlightRecord(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  FlightRecord record;
  const auto text = [&](const char* key, std::string& out) {
    if (!j.contains(key) || !j[key].is_string()) return false;
    out = j[key].get<std::string>();
    return true;
  };
  const auto integer = [&](const char* key, auto& out) {
    if (!j.contains(key) || !j[key].is_number_integer()) return false;
    out = j[key].get<std::remove_reference_t<decltype(out)>>();
    return true;
  };
  std::string dtype, state;
  for (const auto& [key, ok] : std::initializer_list<std::pair<const char*, bool>>{
           {"group", text("group", record.group)},
           {"seq", integer("seq", record.seq)},
           {"op", text("op", record.op)},
           {"count", integer("count", record.count)},
           {"dtype", text("dtype", dtype)},
           {"bytes", integer("bytes", record.bytes)},
           {"peer", integer("peer", record.peer)},
           {"start_us", integer("start_us", record.start_us)},
           {"end_us", integer("end_us", record.end_us)},
           {"state", text("state", state)}}) {
    if (!ok)
      return absl::InvalidArgumentError(absl::StrCat("field '", key, "' missing or mistyped"));
  }
  if (!j.contains("members") || !j["members"].is_array()) {
    return absl::InvalidArgumentError("field 'members' missing or mistyped");
  }
  for (const nlohmann::json& member : j["members"]) {
    if (!member.is_number_integer()) {
      return absl::InvalidArgumentError("field 'members' holds a non-integer");
    }
    record.members.push_back(member.get<int>());
  }
  absl::StatusOr<DataType> type = ParseDataType(dtype);
  if (!type.ok()) return absl::InvalidArgumentError(absl::StrCat("field 'dtype': ", dtype));
  record.type = *type;
  if (state == "started") {
    record.state = FlightState::kStarted;
  } else if (state == "completed") {
    record.state = FlightState::kCompleted;
  } else if (state == "failed") {
    record.state = FlightState::kFailed;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("field 'state': ", state));
  }
  return record;
}

FlightRecorder::FlightRecorder(int rank, int world_size, size_t capacity, std::string dump_dir)
    : rank_(rank), world_size_(world_size), capacity_(capacity), dump_dir_(std::move(dump_dir)) {}

uint64_t FlightRecorder::Record(FlightRecord record) {
  record.start_us = NowMicros();
  std::lock_guard lock(mu_);
  const uint64_t id = next_id_++;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(record));
  } else {
    ring_[id % capacity_] = std::move(record);
  }
  return id;
}

void FlightRecorder::Finish(uint64_t id, bool ok) {
  const int64_t now = NowMicros();
  std::lock_guard lock(mu_);
  if (id + capacity_ < next_id_) return;  // evicted
  FlightRecord& record = ring_[id % capacity_];
  record.end_us = now;
  record.state = ok ? FlightState::kCompleted : FlightState::kFailed;
}

std::vector<FlightRecord> FlightRecorder::Snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<FlightRecord> records;
  records.reserve(ring_.size());
  const uint64_t first = next_id_ - ring_.size();
  for (uint64_t id = first; id < next_id_; ++id) records.push_back(ring_[id % capacity_]);
  return records;
}

absl::StatusOr<std::string> FlightRecorder::Dump(const std::string& reason) const {
  uint64_t recorded;
  {
    std::lock_guard lock(mu_);
    recorded = next_id_;
  }
  const std::vector<FlightRecord> records = Snapshot();
  const std::filesystem::path dir(dump_dir_);
  const std::filesystem::path path = dir / absl::StrCat("rank-", rank_, ".jsonl");
  const std::filesystem::path temporary = dir / absl::StrCat(".rank-", rank_, ".jsonl.tmp");
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << nlohmann::json{{"flight_recorder", 1},      {"rank", rank_},
                          {"world_size", world_size_}, {"capacity", capacity_},
                          {"recorded", recorded},      {"reason", reason},
                          {"time_us", NowMicros()}}
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
        << '\n';
    for (const FlightRecord& record : records) out << FlightRecordJson(record) << '\n';
    out << nlohmann::json{{"end", true}, {"entries", records.size()}}.dump() << '\n';
    out.flush();
    if (!out) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write the flight-recorder dump ", temporary.string(),
                       error ? absl::StrCat(" (", error.message(), ")") : "",
                       "; make the run folder writable or set logging.flight_recorder_entries=0"));
    }
  }
  std::filesystem::rename(temporary, path, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", temporary.string(), " to ",
                                                      path.string(), ": ", error.message()));
  }
  return path.string();
}

std::unique_ptr<Communicator> FlightRecorder::Wrap(std::shared_ptr<FlightRecorder> recorder,
                                                   std::unique_ptr<Communicator> inner,
                                                   std::vector<int> world_ranks) {
  if (!recorder || !inner) return inner;
  return std::make_unique<RecordingCommunicator>(std::move(recorder), std::move(inner),
                                                 std::move(world_ranks));
}

void FlightRecorder::InstallDumpSignal() {
  struct sigaction action = {};
  action.sa_handler = OnDumpSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &action, nullptr);
}

absl::StatusOr<CollectiveFault> ParseCollectiveFault(const std::string& text) {
  const std::vector<std::string> fields = absl::StrSplit(text, ':');
  CollectiveFault fault;
  if (fields.size() != 4 || (fields[0] != "skip" && fields[0] != "resize") ||
      !absl::SimpleAtoi(fields[1], &fault.rank) || !absl::SimpleAtoi(fields[3], &fault.seq) ||
      fields[2].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not <skip|resize>:<world rank>:<group>:<seq>"));
  }
  fault.skip = fields[0] == "skip";
  fault.group = fields[2];
  return fault;
}

}  // namespace dtrain
