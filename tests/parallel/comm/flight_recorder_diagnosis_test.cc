#include "parallel/comm/flight_recorder_diagnosis.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A collective of `group` (members 0..3) as rank dumps hold it.
FlightRecord Collective(int64_t seq, const std::string& op, int64_t count,
                        FlightState state = FlightState::kCompleted,
                        const std::string& group = "dp") {
  FlightRecord record;
  record.group = group;
  record.members = {0, 1, 2, 3};
  record.seq = seq;
  record.op = op;
  record.count = count;
  record.bytes = count * 4;
  record.start_us = 1000 * seq;
  record.state = state;
  return record;
}

// Four ranks' dumps with collectives 1..n (all_reduce of 10 x seq elements), the last one
// started and failed.
std::vector<FlightDump> Agreeing(int n) {
  std::vector<FlightDump> dumps(4);
  for (int rank = 0; rank < 4; ++rank) {
    dumps[rank].rank = rank;
    dumps[rank].path = absl::StrCat("/run/flight_recorder/rank-", rank, ".jsonl");
    dumps[rank].capacity = 100;
    for (int seq = 1; seq <= n; ++seq) {
      dumps[rank].records.push_back(Collective(
          seq, "all_reduce", 10 * seq, seq == n ? FlightState::kFailed : FlightState::kCompleted));
    }
    dumps[rank].recorded = n;
  }
  return dumps;
}

TEST(FlightRecorderDiagnosisTest, ARankWithoutAnEntryNeverEnteredIt) {
  std::vector<FlightDump> dumps = Agreeing(6);
  std::vector<FlightDump> completed = dumps;  // every operation done: nothing found
  for (FlightDump& dump : completed) {
    for (FlightRecord& record : dump.records) record.state = FlightState::kCompleted;
  }
  const FlightDiagnosis agreeing = DiagnoseFlightDumps(completed);
  EXPECT_THAT(agreeing.text, HasSubstr("the dumps agree"));
  EXPECT_FALSE(agreeing.found);
  auto& records = dumps[2].records;
  records.erase(records.begin() + 3);  // #4
  const FlightDiagnosis missed = DiagnoseFlightDumps(dumps);
  EXPECT_THAT(missed.text,
              HasSubstr("rank 2 never entered all_reduce #4 on group 'dp' (40 f32 elements), "
                        "which ranks 0, 1, 3 entered"));
  EXPECT_TRUE(missed.found);
}

TEST(FlightRecorderDiagnosisTest, DifferentSizesAtOneSequenceNumberAreADesync) {
  std::vector<FlightDump> dumps = Agreeing(6);
  dumps[1].records[4].count = 49;
  dumps[3].records[5].op = "all_gather";  // later: not the first finding
  const std::string diagnosis = DiagnoseFlightDumps(dumps).text;
  EXPECT_THAT(diagnosis,
              HasSubstr("desynchronised program: at collective #5 on group 'dp' the ranks "
                        "disagree: ranks 0, 2, 3 called all_reduce of 50 f32 elements; rank 1 "
                        "called all_reduce of 49 f32 elements"));
  EXPECT_THAT(diagnosis, Not(HasSubstr("all_gather")));
}

// A rank that really skipped #3 numbers the others' #4 as its #3: a desync, and the shift says it.
TEST(FlightRecorderDiagnosisTest, ADesyncShiftedByOneIsAProbableSkip) {
  std::vector<FlightDump> dumps = Agreeing(6);
  auto& records = dumps[0].records;
  records.erase(records.begin() + 2);  // #3
  for (size_t i = 2; i < records.size(); ++i) --records[i].seq;
  EXPECT_THAT(DiagnoseFlightDumps(dumps).text,
              HasSubstr("desynchronised program: at collective #3 on group 'dp' the ranks "
                        "disagree: rank 0 called all_reduce of 40 f32 elements; ranks 1, 2, 3 "
                        "called all_reduce of 30 f32 elements (rank 0's #3 is the others' #4: it "
                        "probably skipped all_reduce #3 on group 'dp' (30 f32 elements))"));
  // Another size that is not the next call's says nothing of a skip.
  dumps = Agreeing(6);
  dumps[0].records[2].count = 31;
  EXPECT_THAT(DiagnoseFlightDumps(dumps).text, Not(HasSubstr("skipped")));
}

TEST(FlightRecorderDiagnosisTest, ARankWithoutADumpIsTheOneTheOthersWaitFor) {
  std::vector<FlightDump> dumps = Agreeing(6);
  dumps[1] = LoadFlightDump(1, "");
  EXPECT_THAT(DiagnoseFlightDumps(dumps).text,
              HasSubstr("rank 1 never entered all_reduce #6 on group 'dp' (60 f32 elements) (or "
                        "never finished it), which ranks 0, 2, 3 entered and wait in"));
  EXPECT_THAT(DiagnoseFlightDumps(dumps).text, HasSubstr("rank 1 (no dump"));
}

TEST(FlightRecorderDiagnosisTest, EveryRankInsideAnUnfinishedCollectiveIsSaid) {
  EXPECT_THAT(DiagnoseFlightDumps(Agreeing(3)).text,
              HasSubstr("every rank of group 'dp' entered all_reduce #3 on group 'dp' (30 f32 "
                        "elements) and ranks 0, 1, 2, 3 did not complete it"));
}

// Records a wrapped ring evicted are not missing: comparison starts where every ring holds them.
TEST(FlightRecorderDiagnosisTest, EvictedRecordsAreNotMissing) {
  std::vector<FlightDump> dumps = Agreeing(8);
  dumps[0].records.erase(dumps[0].records.begin(), dumps[0].records.begin() + 4);
  dumps[0].capacity = 4;
  EXPECT_THAT(DiagnoseFlightDumps(dumps).text,
              HasSubstr("every rank of group 'dp' entered all_reduce #8"));
  auto& records = dumps[3].records;
  records.erase(records.begin() + 5);  // #6, inside every window
  EXPECT_THAT(DiagnoseFlightDumps(dumps).text, HasSubstr("rank 3 never entered all_reduce #6"));
  EXPECT_EQ(DiagnoseFlightDumps(dumps).never_entered, std::vector<int>{3});
}

// Two groups of one name with other members are compared apart; the earliest finding comes first.
// Rank 1 waits in a receive from rank 3 (a pipeline stage behind a hung neighbour) since before
// the dp collective #6 it then never entered: the receive leads, naming rank 3 (the summary led
// with "rank 1 never entered", a victim).
TEST(FlightRecorderDiagnosisTest, AReceiveUnfinishedSinceBeforeTheFindingsLeads) {
  std::vector<FlightDump> dumps = Agreeing(6);
  dumps[1].records.pop_back();  // rank 1 never entered #6
  FlightRecord receive;
  receive.group = "pp";
  receive.members = {1, 3};
  receive.seq = 40;
  receive.op = "recv";
  receive.count = 256;
  receive.bytes = 1024;
  receive.peer = 3;
  receive.start_us = 5500;  // after #5, before #6 (6000)
  receive.state = FlightState::kStarted;
  dumps[1].records.push_back(receive);
  const FlightDiagnosis diagnosis = DiagnoseFlightDumps(dumps);
  EXPECT_TRUE(diagnosis.found);
  EXPECT_THAT(diagnosis.text,
              ::testing::StartsWith("rank 1 waits for rank 3 in a recv of 1024 bytes on group "
                                    "'pp' (#40 of its group); also: "));
  EXPECT_THAT(diagnosis.text, HasSubstr("rank 1 never entered"));
  EXPECT_EQ(diagnosis.never_entered, std::vector<int>{3});
  // Started after the collective finding, the receive comes second.
  dumps[1].records.back().start_us = 7000;
  const FlightDiagnosis later = DiagnoseFlightDumps(dumps);
  EXPECT_THAT(later.text, ::testing::StartsWith("rank 1 never entered"));
  EXPECT_THAT(later.text, HasSubstr("; also: rank 1 waits for rank 3 in a recv"));
}

TEST(FlightRecorderDiagnosisTest, GroupsAreComparedApartAndTheEarliestFindingLeads) {
  std::vector<FlightDump> dumps = Agreeing(6);
  for (int rank = 0; rank < 4; ++rank) {
    // The tp group of ranks 0 and 1 completed its collective; that of 2 and 3 disagrees.
    FlightRecord tp = Collective(1, "all_reduce", 8,
                                 rank < 2 ? FlightState::kCompleted : FlightState::kFailed, "tp");
    tp.members = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    tp.start_us = 1;  // before every dp collective
    tp.count = rank == 3 ? 9 : 8;
    dumps[rank].records.push_back(tp);
  }
  const std::string diagnosis = DiagnoseFlightDumps(dumps).text;
  EXPECT_THAT(diagnosis, HasSubstr("desynchronised program: at collective #1 on group 'tp' the "
                                   "ranks disagree: rank 2 called all_reduce of 8 f32 elements; "
                                   "rank 3 called all_reduce of 9 f32 elements; also: every rank"));
}

class FlightDumpFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    std::filesystem::create_directories(dir_);
    const std::string path = dir_ + "/rank-1.jsonl";
    std::ofstream(path) << text;
    return path;
  }
  const std::string header_ =
      R"({"flight_recorder":1,"rank":1,"world_size":4,"capacity":8,"recorded":1,"reason":"x"})"
      "\n";
  const std::string record_ = FlightRecordJson(Collective(1, "all_reduce", 4)) + "\n";
  std::string dir_ = testing::FreshTempDir("fr_files");
};

TEST_F(FlightDumpFileTest, CorruptAndPartialDumpsAreReportedAndTheDiagnosisStillPrinted) {
  EXPECT_EQ(LoadFlightDump(1, Write(header_ + record_ +
                                    R"({"end":true,"entries":1})"
                                    "\n"))
                .problem,
            "");
  EXPECT_THAT(LoadFlightDump(1, Write(header_ + record_)).problem,
              HasSubstr("partial: it ends after 1 records without its end line"));
  EXPECT_THAT(LoadFlightDump(1, Write(header_ + "{\"group\": \x01garbage\n")).problem,
              HasSubstr("corrupt: line 2: not a JSON object"));
  EXPECT_THAT(LoadFlightDump(1, Write(header_ + R"({"group":"dp","seq":"x"})"
                                                "\n"))
                  .problem,
              HasSubstr("corrupt: line 2: field 'seq' missing or mistyped"));
  EXPECT_THAT(LoadFlightDump(1, Write("")).problem, HasSubstr("corrupt: empty file"));
  EXPECT_THAT(LoadFlightDump(1, Write(R"({"rank":3})"
                                      "\n"))
                  .problem,
              HasSubstr("corrupt: line 1 is not the flight-recorder header of rank 1"));
  EXPECT_THAT(LoadFlightDump(1, dir_ + "/absent.jsonl").problem, HasSubstr("unreadable"));

  std::vector<FlightDump> dumps = Agreeing(6);
  dumps[2].records.erase(dumps[2].records.begin() + 1);  // #2
  dumps[1] = LoadFlightDump(1, Write(header_ + "\xff\xfe not json\n"));
  const std::string diagnosis = DiagnoseFlightDumps(dumps).text;
  EXPECT_THAT(diagnosis, HasSubstr("rank 2 never entered all_reduce #2 on group 'dp'"));
  EXPECT_THAT(diagnosis, HasSubstr("rank 1 " + dir_ + "/rank-1.jsonl (corrupt: line 2"));
  EXPECT_THAT(diagnosis, HasSubstr("rank 0 /run/flight_recorder/rank-0.jsonl"));
}

// Ranks that failed before their first collective published dumps of nothing: there is nothing
// to diagnose (a line saying the dumps agree would sit beside a missing data file's error).
TEST_F(FlightDumpFileTest, DumpsOfNoOperationGiveNoDiagnosis) {
  testing::InMemoryStore store;
  const std::string empty =
      Write(R"({"flight_recorder":1,"rank":1,"world_size":2,"capacity":8,"recorded":0,)"
            R"("reason":"x"})"
            "\n"
            R"({"end":true,"entries":0})"
            "\n");
  ASSERT_EQ(LoadFlightDump(1, empty).problem, "");
  ASSERT_TRUE(store.Set(FlightDumpKey(0, 1), empty).ok());
  EXPECT_FALSE(DiagnosePublishedFlightDumps(store, 0, 2).has_value());
  // One operation recorded is worth comparing.
  ASSERT_TRUE(store
                  .Set(FlightDumpKey(0, 1), Write(header_ + record_ +
                                                  R"({"end":true,"entries":1})"
                                                  "\n"))
                  .ok());
  EXPECT_TRUE(DiagnosePublishedFlightDumps(store, 0, 2).has_value());
}

TEST(FlightRecorderDiagnosisTest, DumpsAreFoundThroughTheStore) {
  testing::InMemoryStore store;
  EXPECT_FALSE(DiagnosePublishedFlightDumps(store, 0, 2).has_value());
  ASSERT_TRUE(store.Set(FlightDumpKey(0, 1), "").ok());
  const std::optional<FlightDiagnosis> diagnosis = DiagnosePublishedFlightDumps(store, 0, 2);
  ASSERT_TRUE(diagnosis.has_value());
  EXPECT_THAT(diagnosis->text, HasSubstr("no usable dump to compare"));
  EXPECT_THAT(diagnosis->text, HasSubstr("rank 0 (no dump"));
  EXPECT_THAT(diagnosis->text, HasSubstr("rank 1 (the rank could not write its dump)"));
  EXPECT_TRUE(diagnosis->never_entered.empty());
}

}  // namespace
}  // namespace dtrain
