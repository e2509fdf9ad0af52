#include "parallel/comm/flight_recorder_diagnosis.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "parallel/world_membership.h"

namespace dtrain {
namespace {

struct Finding {
  int64_t start_us = 0;  // when the operation was first issued: the earliest finding is the cause
  std::string text;
  std::vector<int> never_entered;  // FlightDiagnosis::never_entered
};

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

std::string Describe(const FlightRecord& record) {
  return absl::StrFormat("%s #%d on group '%s' (%d %s elements)", record.op, record.seq,
                         record.group, record.count, DataTypeName(record.type));
}

bool SameCall(const FlightRecord& a, const FlightRecord& b) {
  return a.op == b.op && a.count == b.count && a.type == b.type;
}

// Group members' collectives by sequence number: rank -> seq -> record.
using Sequences = std::map<int, std::map<int64_t, const FlightRecord*>>;

// The first finding of one group, if any.
std::optional<Finding> CompareGroup(const std::vector<int>& members, const Sequences& sequences,
                                    const std::map<int, const FlightDump*>& valid) {
  std::vector<int> dumped, undumped;
  for (const int member : members) (valid.contains(member) ? dumped : undumped).push_back(member);
  // Below `first`, a rank whose ring wrapped may have lost its records: not comparable.
  int64_t first = 1, last = 0;
  for (const int rank : dumped) {
    const auto it = sequences.find(rank);
    const bool empty = it == sequences.end() || it->second.empty();
    const FlightDump& dump = *valid.at(rank);
    if (dump.recorded > dump.capacity) {
      first =
          std::max(first, empty ? std::numeric_limits<int64_t>::max() : it->second.begin()->first);
    }
    if (!empty) last = std::max(last, it->second.rbegin()->first);
  }
  for (int64_t seq = first; seq <= last; ++seq) {
    std::vector<std::pair<int, const FlightRecord*>> entered;
    std::vector<int> absent;
    for (const int rank : dumped) {
      const auto it = sequences.find(rank);
      const auto at = it == sequences.end() ? nullptr : &it->second;
      if (at != nullptr && at->contains(seq)) {
        entered.emplace_back(rank, at->at(seq));
      } else {
        absent.push_back(rank);
      }
    }
    if (entered.empty()) continue;
    Finding finding;
    finding.start_us = std::numeric_limits<int64_t>::max();
    for (const auto& [rank, record] : entered) {
      finding.start_us = std::min(finding.start_us, record->start_us);
    }
    // Distinct (op, count, type) among the ranks that entered, in rank order of first sight.
    std::vector<std::pair<const FlightRecord*, std::vector<int>>> variants;
    std::vector<int> entered_ranks, unfinished;
    for (const auto& [rank, record] : entered) {
      entered_ranks.push_back(rank);
      if (record->state != FlightState::kCompleted) unfinished.push_back(rank);
      auto same = std::find_if(variants.begin(), variants.end(),
                               [&](const auto& v) { return SameCall(*v.first, *record); });
      if (same == variants.end()) {
        variants.push_back({record, {rank}});
      } else {
        same->second.push_back(rank);
      }
    }
    const FlightRecord& reference = *entered.front().second;
    if (variants.size() > 1) {
      std::vector<std::string> sides;
      for (const auto& [record, ranks] : variants) {
        sides.push_back(absl::StrFormat("%s called %s of %d %s elements", Ranks(ranks), record->op,
                                        record->count, DataTypeName(record->type)));
      }
      finding.text = absl::StrFormat(
          "desynchronised program: at collective #%d on group '%s' the ranks disagree: %s", seq,
          reference.group, absl::StrJoin(sides, "; "));
      // A rank that skipped a collective calls the others' next one at its number.
      const auto& [majority, majority_ranks] = *std::max_element(
          variants.begin(), variants.end(),
          [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
      const auto next = sequences.at(majority_ranks.front()).find(seq + 1);
      for (const auto& [record, ranks] : variants) {
        if (next == sequences.at(majority_ranks.front()).end() || record == majority) continue;
        if (SameCall(*record, *next->second)) {
          absl::StrAppendFormat(
              &finding.text, " (%s's #%d is the others' #%d: %s probably skipped %s)", Ranks(ranks),
              seq, seq + 1, ranks.size() == 1 ? "it" : "they", Describe(*majority));
        }
      }
      return finding;
    }
    if (!absent.empty()) {
      finding.text = absl::StrFormat("%s never entered %s, which %s entered", Ranks(absent),
                                     Describe(reference), Ranks(entered_ranks));
      finding.never_entered = absent;
      return finding;
    }
    if (unfinished.empty()) continue;
    if (!undumped.empty()) {
      finding.text = absl::StrFormat(
          "%s never entered %s (or never finished it), which %s entered and wait in: %s left no "
          "flight-recorder dump (stopped, hung or dead)",
          Ranks(undumped), Describe(reference), Ranks(entered_ranks),
          undumped.size() == 1 ? "it" : "they");
      finding.never_entered = undumped;
    } else {
      finding.text = absl::StrFormat(
          "every rank of group '%s' entered %s and %s did not complete it: a rank stalled inside "
          "it or the transport failed",
          reference.group, Describe(reference), Ranks(unfinished));
    }
    return finding;
  }
  return std::nullopt;
}

}  // namespace

FlightDump LoadFlightDump(int rank, const std::string& path) {
  FlightDump dump;
  dump.rank = rank;
  dump.path = path;
  if (path.empty()) {
    dump.problem = "no dump (stopped, hung or dead before it could write one)";
    return dump;
  }
  std::ifstream in(path);
  if (!in) {
    dump.problem = "unreadable from this host (missing, or the run folder is not shared)";
    return dump;
  }
  std::string line;
  const auto corrupt = [&](const std::string& why) {
    dump.records.clear();
    dump.problem = absl::StrCat("corrupt: ", why);
    return dump;
  };
  if (!std::getline(in, line)) return corrupt("empty file");
  const nlohmann::json header = nlohmann::json::parse(line, nullptr, false);
  if (!header.is_object() || !header.contains("flight_recorder") ||
      !header["rank"].is_number_integer() || header["rank"].get<int>() != rank ||
      !header["capacity"].is_number_integer() || !header["recorded"].is_number_integer()) {
    return corrupt(absl::StrCat("line 1 is not the flight-recorder header of rank ", rank));
  }
  dump.capacity = header["capacity"].get<int64_t>();
  dump.recorded = header["recorded"].get<int64_t>();
  for (int line_number = 2; std::getline(in, line); ++line_number) {
    const nlohmann::json trailer = nlohmann::json::parse(line, nullptr, false);
    if (trailer.is_object() && trailer.contains("end")) {
      if (!trailer["entries"].is_number_integer() ||
          trailer["entries"].get<size_t>() != dump.records.size()) {
        return corrupt(absl::StrCat("the end line (line ", line_number, ") counts ",
                                    trailer.value("entries", nlohmann::json()).dump(),
                                    " records, the file holds ", dump.records.size()));
      }
      return dump;
    }
    absl::StatusOr<FlightRecord> record = ParseFlightRecord(line);
    if (!record.ok()) {
      return corrupt(absl::StrCat("line ", line_number, ": ", record.status().message()));
    }
    dump.records.push_back(*std::move(record));
  }
  const size_t held = dump.records.size();
  dump.records.clear();
  dump.problem = absl::StrCat("partial: it ends after ", held, " records without its end line");
  return dump;
}

FlightDiagnosis DiagnoseFlightDumps(const std::vector<FlightDump>& dumps) {
  std::map<int, const FlightDump*> valid;
  std::map<std::pair<std::string, std::vector<int>>, Sequences> groups;
  const FlightRecord* stuck_point_to_point = nullptr;  // the oldest unfinished one
  int stuck_rank = -1;                                 // whose dump holds it
  for (const FlightDump& dump : dumps) {
    if (!dump.problem.empty()) continue;
    valid[dump.rank] = &dump;
    for (const FlightRecord& record : dump.records) {
      if (record.point_to_point()) {
        if (record.state != FlightState::kCompleted &&
            (stuck_point_to_point == nullptr || record.start_us < stuck_point_to_point->start_us)) {
          stuck_point_to_point = &record;
          stuck_rank = dump.rank;
        }
        continue;
      }
      groups[{record.group, record.members}][dump.rank][record.seq] = &record;
    }
  }
  std::vector<Finding> findings;
  for (const auto& [key, sequences] : groups) {
    if (std::optional<Finding> finding = CompareGroup(key.second, sequences, valid)) {
      findings.push_back(*std::move(finding));
    }
  }
  // The oldest point-to-point operation left unfinished is a finding of its own: its rank waits
  // for the peer, and may be a later finding's absent rank only because it waits (a pipeline
  // stage stuck in a receive never enters its data-parallel reduction).
  if (stuck_point_to_point != nullptr) {
    const FlightRecord& stuck = *stuck_point_to_point;
    findings.push_back(Finding{
        stuck.start_us,
        absl::StrFormat("%srank %d waits for rank %d in a %s of %d bytes on group '%s' (#%d of "
                        "its group)",
                        findings.empty() ? "the collectives agree; " : "", stuck_rank, stuck.peer,
                        stuck.op, stuck.bytes, stuck.group, stuck.seq),
        {stuck.peer}});
  }
  std::stable_sort(findings.begin(), findings.end(),
                   [](const Finding& a, const Finding& b) { return a.start_us < b.start_us; });
  std::string text;
  FlightDiagnosis diagnosis;
  diagnosis.found = !findings.empty();
  if (!findings.empty()) {
    text = findings.front().text;
    diagnosis.never_entered = findings.front().never_entered;
    for (size_t i = 1; i < findings.size(); ++i)
      absl::StrAppend(&text, "; also: ", findings[i].text);
  } else {
    text = valid.empty() ? "no usable dump to compare"
                         : "the dumps agree: no rank missed or mismatched an operation they hold";
  }
  std::vector<std::string> where;
  for (const FlightDump& dump : dumps) {
    if (dump.problem.empty()) {
      where.push_back(absl::StrCat("rank ", dump.rank, " ", dump.path));
    } else {
      where.push_back(absl::StrCat("rank ", dump.rank, " ", dump.path.empty() ? "" : dump.path,
                                   dump.path.empty() ? "" : " ", "(", dump.problem, ")"));
    }
  }
  diagnosis.text = absl::StrCat(text, ". Dumps: ", absl::StrJoin(where, ", "));
  return diagnosis;
}

std::string FlightDumpKey(int restart_count, int rank) {
  return AgentKey(restart_count, absl::StrCat("flight_recorder/", rank));
}

std::optional<FlightDiagnosis> DiagnosePublishedFlightDumps(Store& store, int restart_count,
                                                            int world_size) {
  std::vector<FlightDump> dumps;
  // Published dumps of no operation (ranks that failed before their first collective, on a
  // missing data file, say) compare nothing: no diagnosis, rather than one that the dumps agree.
  bool worth_comparing = false;
  for (int rank = 0; rank < world_size; ++rank) {
    const absl::StatusOr<std::string> path =
        store.Get(FlightDumpKey(restart_count, rank), absl::ZeroDuration());
    dumps.push_back(LoadFlightDump(rank, path.value_or("")));
    if (!path.ok()) continue;
    if (path->empty()) dumps.back().problem = "the rank could not write its dump";
    worth_comparing |= !dumps.back().problem.empty() || dumps.back().recorded > 0;
  }
  if (!worth_comparing) return std::nullopt;
  return DiagnoseFlightDumps(dumps);
}

}  // namespace dtrain
