// The comparison of the ranks' flight-recorder dumps (flight_recorder.h) after a failure: per
// group (name and members), the collectives at each sequence number from where every rank's ring
// still holds them. The first number at which the ranks that entered disagree on the operation,
// element count or data type is a desynchronised program (a rank whose call there is the others'
// next one probably skipped theirs: said as such); the first at which some rank with a
// dump has no entry while others have one names the rank that never entered it; the first that
// some rank did not complete while every dump agrees names the ranks without a dump (stopped, hung
// or dead) as never having entered it, or else says that every rank entered it and which did not
// finish it. The oldest point-to-point operation some rank left unfinished is a finding too (the
// rank waits for that peer, and may be a later finding's absent rank only because it waits). The
// earliest finding leads.
// A missing, corrupt or partial dump is reported as such and never stops the comparison.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/flight_recorder.h"
#include "parallel/store/store.h"

namespace dtrain {

struct FlightDump {
  int rank = -1;
  std::string path;     // empty: the rank published none
  std::string problem;  // empty for a complete dump; else why its records are not used
  int64_t capacity = 0;
  int64_t recorded = 0;  // operations recorded since start; > capacity: the oldest were evicted
  std::vector<FlightRecord> records;
};

// Reads `path` (empty: the rank left no dump). Never fails: what is wrong goes to `problem`.
FlightDump LoadFlightDump(int rank, const std::string& path);

struct FlightDiagnosis {
  // One line for the user: the first finding (the diagnosis), others after it, then every rank's
  // dump path or why it has none.
  std::string text;
  // The ranks the first finding names as never having entered an operation others entered, or
  // the peer its rank waits for when it is a point-to-point operation: the root cause of a hang
  // (empty for a desynchronised program, or when every rank entered).
  std::vector<int> never_entered;
  // Whether the dumps show something wrong: a finding (false: they agree, or none could be
  // compared).
  bool found = false;
};

FlightDiagnosis DiagnoseFlightDumps(const std::vector<FlightDump>& dumps);

// Where rank `rank` of restart `restart_count` publishes its dump's path (empty: it could not
// write one), in the job's store (parallel/world_membership.h's AgentKey).
std::string FlightDumpKey(int restart_count, int rank);
// DiagnoseFlightDumps over the dumps the ranks of a world published; nullopt when none did (no
// flight recorder).
std::optional<FlightDiagnosis> DiagnosePublishedFlightDumps(Store& store, int restart_count,
                                                            int world_size);

}  // namespace dtrain
