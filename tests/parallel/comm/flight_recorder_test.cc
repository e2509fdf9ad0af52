#include "parallel/comm/flight_recorder.h"

#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/comm/flight_recorder_diagnosis.h"
#include "parallel/comm/gloo_communicator.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

FlightRecord Op(const std::string& op, int64_t count) {
  FlightRecord record;
  record.group = "world";
  record.members = {0};
  record.op = op;
  record.count = count;
  record.bytes = count * 4;
  return record;
}

std::vector<int64_t> Counts(const std::vector<FlightRecord>& records) {
  std::vector<int64_t> counts;
  for (const FlightRecord& record : records) counts.push_back(record.count);
  return counts;
}

TEST(FlightRecorderTest, TheRingKeepsTheNewestEntriesOldestFirst) {
  FlightRecorder recorder(0, 1, 3, testing::FreshTempDir("fr_ring"));
  std::vector<uint64_t> ids;
  for (int i = 1; i <= 5; ++i) ids.push_back(recorder.Record(Op("all_reduce", i)));
  EXPECT_THAT(Counts(recorder.Snapshot()), ElementsAre(3, 4, 5));
  recorder.Finish(ids[0], true);   // evicted: changes nothing
  recorder.Finish(ids[3], false);  // count 4
  recorder.Finish(ids[4], true);   // count 5
  const std::vector<FlightRecord> records = recorder.Snapshot();
  EXPECT_EQ(records[0].state, FlightState::kStarted);
  EXPECT_EQ(records[1].state, FlightState::kFailed);
  EXPECT_EQ(records[2].state, FlightState::kCompleted);
  EXPECT_GT(records[2].end_us, 0);
  EXPECT_EQ(records[0].end_us, 0);
}

TEST(FlightRecorderTest, ADumpLoadsBackRecordForRecord) {
  FlightRecorder recorder(2, 4, 2, testing::FreshTempDir("fr_dump"));
  FlightRecord send = Op("send", 7);
  send.peer = 3;
  send.type = DataType::kBF16;
  recorder.Record(Op("all_reduce", 1));
  recorder.Finish(recorder.Record(Op("all_gather", 2)), true);
  recorder.Record(send);
  const absl::StatusOr<std::string> path = recorder.Dump("a test");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_THAT(*path, HasSubstr("rank-2.jsonl"));
  const FlightDump dump = LoadFlightDump(2, *path);
  ASSERT_EQ(dump.problem, "");
  EXPECT_EQ(dump.capacity, 2);
  EXPECT_EQ(dump.recorded, 3);
  ASSERT_EQ(dump.records.size(), 2u);
  EXPECT_EQ(FlightRecordJson(dump.records[0]), FlightRecordJson(recorder.Snapshot()[0]));
  EXPECT_EQ(FlightRecordJson(dump.records[1]), FlightRecordJson(recorder.Snapshot()[1]));
  EXPECT_EQ(dump.records[1].peer, 3);
  EXPECT_EQ(dump.records[1].type, DataType::kBF16);
}

// A group of one Gloo rank, wrapped: each group numbers its collectives and its point-to-point
// operations apart; a Wait marks the outcome, a rejected reduction takes no number.
TEST(FlightRecorderTest, TheDecoratorRecordsEveryOperationWithItsGroupSequence) {
  auto store = std::make_shared<testing::InMemoryStore>();
  GlooCommunicatorOptions options;
  options.name = "dp";
  options.key_prefix = "comm/dp/";
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> gloo = GlooCommunicator::Create(store, options);
  ASSERT_TRUE(gloo.ok()) << gloo.status();
  auto recorder = std::make_shared<FlightRecorder>(0, 8, 16, testing::FreshTempDir("fr_wrap"));
  std::unique_ptr<Communicator> comm = FlightRecorder::Wrap(recorder, *std::move(gloo), {5});
  std::vector<float> data(6, 1.0f);
  std::vector<int64_t> integers(2, 1);
  ASSERT_TRUE(comm->AllReduce(data.data(), 6, ReduceOp::kSum)->Wait().ok());
  EXPECT_FALSE(comm->AllReduce(integers.data(), 2, ReduceOp::kAvg)->Wait().ok());  // rejected
  ASSERT_TRUE(comm->Broadcast(data.data(), 3, 0)->Wait().ok());
  EXPECT_FALSE(comm->Send(data.data(), 2, 0)->Wait().ok());  // to itself: invalid
  ASSERT_TRUE(comm->Barrier().ok());
  const std::vector<FlightRecord> records = recorder->Snapshot();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].op, "all_reduce");
  EXPECT_EQ(records[0].seq, 1);
  EXPECT_EQ(records[0].bytes, 24);
  EXPECT_EQ(records[0].state, FlightState::kCompleted);
  EXPECT_THAT(records[0].members, ElementsAre(5));
  EXPECT_EQ(records[1].op, "broadcast");
  EXPECT_EQ(records[1].seq, 2);
  EXPECT_EQ(records[2].op, "send");
  EXPECT_EQ(records[2].seq, 1);
  EXPECT_EQ(records[2].peer, 5);
  EXPECT_EQ(records[2].state, FlightState::kFailed);
  EXPECT_EQ(records[3].op, "barrier");
  EXPECT_EQ(records[3].seq, 3);
  EXPECT_EQ(records[3].group, "dp");
}

// SIGUSR2 only sets a flag: the next operation issued dumps the ring as it was.
TEST(FlightRecorderTest, Sigusr2DumpsAtTheNextOperation) {
  auto store = std::make_shared<testing::InMemoryStore>();
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> gloo =
      GlooCommunicator::Create(store, GlooCommunicatorOptions{});
  ASSERT_TRUE(gloo.ok()) << gloo.status();
  const std::string dir = testing::FreshTempDir("fr_sigusr2");
  auto recorder = std::make_shared<FlightRecorder>(0, 1, 16, dir);
  std::unique_ptr<Communicator> comm = FlightRecorder::Wrap(recorder, *std::move(gloo), {});
  FlightRecorder::InstallDumpSignal();
  double value = 1;
  ASSERT_TRUE(comm->AllReduce(&value, 1, ReduceOp::kSum)->Wait().ok());
  EXPECT_FALSE(std::ifstream(dir + "/rank-0.jsonl").good());
  raise(SIGUSR2);
  ASSERT_TRUE(comm->AllReduce(&value, 1, ReduceOp::kSum)->Wait().ok());
  const FlightDump dump = LoadFlightDump(0, dir + "/rank-0.jsonl");
  ASSERT_EQ(dump.problem, "");
  ASSERT_EQ(dump.records.size(), 1u);
  EXPECT_EQ(dump.records[0].seq, 1);
}

TEST(FlightRecorderTest, FaultsParseAndMalformedOnesAreNamed) {
  const absl::StatusOr<CollectiveFault> skip = ParseCollectiveFault("skip:2:dp:17");
  ASSERT_TRUE(skip.ok()) << skip.status();
  EXPECT_TRUE(skip->skip);
  EXPECT_EQ(skip->rank, 2);
  EXPECT_EQ(skip->group, "dp");
  EXPECT_EQ(skip->seq, 17);
  EXPECT_FALSE(ParseCollectiveFault("resize:1:world:3")->skip);
  EXPECT_THAT(ParseCollectiveFault("drop:1:world:3").status().message(),
              HasSubstr("'drop:1:world:3' is not <skip|resize>:<world rank>:<group>:<seq>"));
  EXPECT_FALSE(ParseCollectiveFault("skip:x:world:3").ok());
}

}  // namespace
}  // namespace dtrain
