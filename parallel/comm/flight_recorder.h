// The flight recorder: every rank keeps its last `capacity` collective and point-to-point
// operations, of every group, in one ring (group, per-group sequence number, op, elements, data
// type, bytes, peer, issue and end times, state). A failing rank dumps the ring as JSON lines,
// and the ranks' dumps, compared (flight_recorder_diagnosis.h), name the rank that never entered
// an operation or the ranks whose programs desynchronised.
//
// Recording happens in a Communicator decorator (Wrap), so every backend and group is covered
// once. A group numbers its collectives 1, 2, ... in issue order, as GlooCommunicator does (its
// messages' "#N" is the same N), and its point-to-point operations separately. An operation is
// "started" when issued; its Work's Wait marks it completed or failed.
//
// Dump format (rank-<R>.jsonl): a header object {"flight_recorder": 1, "rank", "world_size",
// "capacity", "recorded" (operations recorded since start, evicted ones included), "reason"},
// one object per operation, oldest first, and a trailer {"end": true, "entries": K}: a dump
// without its trailer is partial.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

enum class FlightState { kStarted, kCompleted, kFailed };
const char* FlightStateName(FlightState state);  // "started", "completed", "failed"

struct FlightRecord {
  std::string group;         // the communicator's name ("world", "dp", ...)
  std::vector<int> members;  // the group's world ranks, by group rank: tells two "dp" groups apart
  int64_t seq = 0;           // per group, collectives and point-to-point counted apart
  std::string op;            // "all_reduce", "reduce_scatter", ..., "send", "recv", "barrier"
  int64_t count = 0;         // elements
  DataType type = DataType::kF32;
  int64_t bytes = 0;     // count x element size
  int peer = -1;         // send/recv only: the peer's world rank
  int64_t start_us = 0;  // Unix time of the issue
  int64_t end_us = 0;    // Unix time Wait returned; 0 while started
  FlightState state = FlightState::kStarted;

  bool point_to_point() const { return op == "send" || op == "recv"; }
};

// One JSON line of a dump, and its inverse (InvalidArgument naming the field that is wrong).
std::string FlightRecordJson(const FlightRecord& record);
absl::StatusOr<FlightRecord> ParseFlightRecord(const std::string& line);

class FlightRecorder {
 public:
  // `dump_dir` receives rank-<rank>.jsonl. capacity > 0.
  FlightRecorder(int rank, int world_size, size_t capacity, std::string dump_dir);

  // Appends `record` (evicting the oldest when full); returns its id for Finish.
  uint64_t Record(FlightRecord record);
  // Marks record `id` completed or failed, unless it was evicted since.
  void Finish(uint64_t id, bool ok);
  // The records held, oldest first.
  std::vector<FlightRecord> Snapshot() const;

  // Writes the ring to <dump_dir>/rank-<rank>.jsonl (a temporary file renamed over it, so that a
  // reader never sees a half-written dump of this process) and returns the path.
  absl::StatusOr<std::string> Dump(const std::string& reason) const;

  // `inner` with every operation recorded here under its group. world_ranks[i] is the world rank
  // of group rank i (empty: the identity). The recorder outlives the decorator as needed.
  static std::unique_ptr<Communicator> Wrap(std::shared_ptr<FlightRecorder> recorder,
                                            std::unique_ptr<Communicator> inner,
                                            std::vector<int> world_ranks);

  // SIGUSR2 asks every recorder of the process to dump; the handler only sets a flag, and the
  // next operation issued on a wrapped communicator dumps (a safe point). Idempotent.
  static void InstallDumpSignal();

  int rank() const { return rank_; }

 private:
  const int rank_;
  const int world_size_;
  const size_t capacity_;
  const std::string dump_dir_;
  mutable std::mutex mu_;
  std::vector<FlightRecord> ring_;  // slot id % capacity_
  uint64_t next_id_ = 0;
};

// Test-only fault injection, read from DTRAIN_TEST_COLLECTIVE_FAULT (unset in every real run):
// "<skip|resize>:<world rank>:<group>:<seq>" makes that rank's first all-reduce on the group at
// or after collective #seq misbehave. skip: the all-reduce is never run but its sequence number
// passes, as for a rank that never entered it (its Work reports success). resize: it runs with
// one element fewer (a desynchronised program). Used by the flight-recorder tests only.
struct CollectiveFault {
  bool skip = false;  // else resize
  int rank = -1;
  std::string group;
  int64_t seq = 0;
};
absl::StatusOr<CollectiveFault> ParseCollectiveFault(const std::string& text);

}  // namespace dtrain
