#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using Kind = PipelineActionKind;

constexpr PipelineSchedule kAllSchedules[] = {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB,
                                              PipelineSchedule::kInterleaved};

std::string Describe(const PipelineShape& shape) {
  return absl::StrCat(PipelineScheduleName(shape.schedule), " p=", shape.stages,
                      " v=", shape.virtual_stages, " m=", shape.micro_batches);
}

std::vector<std::string> Formatted(const std::vector<PipelineAction>& actions) {
  std::vector<std::string> out;
  for (const PipelineAction& action : actions) out.push_back(FormatAction(action));
  return out;
}

// What the simulation of one step saw.
struct Simulation {
  std::string error;          // empty when the step completed and every check held
  std::vector<int> max_live;  // per stage: most micro-batch activations held at once
  std::vector<int> forwards_before_backward;  // per stage
};

// Runs every stage's actions together with the executor's semantics (schedule.h): a send is
// posted and never blocks (the communicator buffers it until the peer receives); a receive is
// posted where it is listed and never blocks either; the n-th receive one stage posts from a
// peer matches the n-th send of that peer to it; a compute waits until the message it needs has
// been sent. The stages take turns, each running until it would wait; a round in which no stage
// moves is a deadlock. Checks that every matched send is what its receive expects, and that each
// compute has its inputs: a forward the previous model chunk's forward of the same micro-batch
// (received, when on another stage), a backward its own forward and the next model chunk's
// backward.
Simulation Simulate(const PipelineShape& shape,
                    const std::vector<std::vector<PipelineAction>>& lists) {
  const int p = shape.stages, v = shape.virtual_stages, m = shape.micro_batches;
  const int model_chunks = p * v;
  Simulation sim;
  sim.max_live.assign(p, 0);
  sim.forwards_before_backward.assign(p, 0);
  std::vector<size_t> pc(p, 0);
  std::vector<int> live(p, 0);
  std::vector<bool> seen_backward(p, false);
  // Per (from, to): the sends posted, and the receives posted.
  std::map<std::pair<int, int>, std::vector<PipelineAction>> sent, posted;
  // Per stage: a posted receive (kind, micro_batch, chunk) -> its pair and index there.
  std::vector<std::map<std::tuple<Kind, int, int>, std::pair<std::pair<int, int>, size_t>>> pending(
      p);
  // Per model chunk and micro-batch.
  std::vector<std::vector<bool>> forward_done(model_chunks, std::vector<bool>(m, false));
  std::vector<std::vector<bool>> backward_done(model_chunks, std::vector<bool>(m, false));
  const auto fail = [&](int stage, const PipelineAction& action, const std::string& why) {
    if (sim.error.empty()) {
      sim.error = absl::StrCat("stage ", stage, " action ", pc[stage], " ", FormatAction(action),
                               ": ", why);
    }
  };
  // The message `receive` expects from the sender's side.
  const auto expected_send = [&](int stage, const PipelineAction& receive) {
    const bool forward = receive.kind == Kind::kRecvForward;
    const int from_mc = receive.chunk * p + stage + (forward ? -1 : 1);
    return PipelineAction{forward ? Kind::kSendForward : Kind::kSendBackward, receive.micro_batch,
                          from_mc / p, stage};
  };
  // Whether the compute `a` of `stage` may run: its received input is there (true), it must
  // wait (false), or it was never posted (fails).
  const auto input_arrived = [&](int stage, const PipelineAction& a, Kind receive_kind) {
    auto it = pending[stage].find({receive_kind, a.micro_batch, a.chunk});
    if (it == pending[stage].end()) {
      fail(stage, a, "its input was never received");
      return false;
    }
    const auto [pair, index] = it->second;
    if (sent[pair].size() <= index) return false;
    const PipelineAction& match = sent[pair][index];
    if (match != expected_send(stage, posted[pair][index])) {
      fail(stage, a, absl::StrCat("its receive matched the peer's ", FormatAction(match)));
      return false;
    }
    pending[stage].erase(it);
    return true;
  };

  bool moved = true;
  while (moved && sim.error.empty()) {
    moved = false;
    for (int s = 0; s < p && sim.error.empty(); ++s) {
      while (pc[s] < lists[s].size() && sim.error.empty()) {
        const PipelineAction& a = lists[s][pc[s]];
        const int mc = a.chunk * p + s;
        if (a.chunk < 0 || a.chunk >= v || a.micro_batch < 0 || a.micro_batch >= m) {
          fail(s, a, "micro-batch or chunk out of range");
          break;
        }
        const bool is_compute = a.kind == Kind::kForward || a.kind == Kind::kBackward;
        if (!is_compute && (a.peer < 0 || a.peer >= p || a.peer == s)) {
          fail(s, a, "bad peer");
          break;
        }
        if (a.kind == Kind::kSendForward || a.kind == Kind::kSendBackward) {
          sent[{s, a.peer}].push_back(a);
        } else if (a.kind == Kind::kRecvForward || a.kind == Kind::kRecvBackward) {
          std::vector<PipelineAction>& queue = posted[{a.peer, s}];
          pending[s][{a.kind, a.micro_batch, a.chunk}] = {{a.peer, s}, queue.size()};
          queue.push_back(a);
        } else if (a.kind == Kind::kForward) {
          if (mc > 0 && p > 1 && !input_arrived(s, a, Kind::kRecvForward)) break;
          if (forward_done[mc][a.micro_batch]) fail(s, a, "second forward");
          if (mc > 0 && !forward_done[mc - 1][a.micro_batch]) fail(s, a, "input not computed");
          forward_done[mc][a.micro_batch] = true;
          sim.max_live[s] = std::max(sim.max_live[s], ++live[s]);
          if (!seen_backward[s]) ++sim.forwards_before_backward[s];
        } else {
          if (mc + 1 < model_chunks && p > 1 && !input_arrived(s, a, Kind::kRecvBackward)) break;
          if (!forward_done[mc][a.micro_batch]) fail(s, a, "backward before its forward");
          if (backward_done[mc][a.micro_batch]) fail(s, a, "second backward");
          if (mc + 1 < model_chunks && !backward_done[mc + 1][a.micro_batch]) {
            fail(s, a, "output gradient not computed");
          }
          backward_done[mc][a.micro_batch] = true;
          --live[s];
          seen_backward[s] = true;
        }
        ++pc[s];
        moved = true;
      }
    }
  }
  if (!sim.error.empty()) return sim;
  std::vector<std::string> stuck;
  for (int s = 0; s < p; ++s) {
    if (pc[s] < lists[s].size()) {
      stuck.push_back(absl::StrCat("stage ", s, " at ", FormatAction(lists[s][pc[s]])));
    }
  }
  if (!stuck.empty()) {
    sim.error = absl::StrCat("deadlock: ", absl::StrJoin(stuck, ", "));
    return sim;
  }
  // Every send received and every receive matched, as its receiver expected.
  for (const auto& [pair, sends] : sent) {
    const std::vector<PipelineAction>& receives = posted[pair];
    if (sends.size() != receives.size()) {
      sim.error = absl::StrCat(sends.size(), " sends from stage ", pair.first, " to stage ",
                               pair.second, " but ", receives.size(), " receives");
      return sim;
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      if (sends[i] != expected_send(pair.second, receives[i])) {
        sim.error = absl::StrCat("stage ", pair.second, "'s ", FormatAction(receives[i]),
                                 " matched ", FormatAction(sends[i]));
        return sim;
      }
    }
  }
  for (int mc = 0; mc < model_chunks; ++mc) {
    for (int mb = 0; mb < m; ++mb) {
      if (!forward_done[mc][mb] || !backward_done[mc][mb]) {
        sim.error = absl::StrCat("model chunk ", mc, " micro-batch ", mb, " not run");
        return sim;
      }
    }
  }
  return sim;
}

std::vector<std::vector<PipelineAction>> AllStages(const PipelineShape& shape) {
  std::vector<std::vector<PipelineAction>> lists;
  for (int s = 0; s < shape.stages; ++s) {
    absl::StatusOr<std::vector<PipelineAction>> actions = StageActions(shape, s);
    EXPECT_TRUE(actions.ok()) << Describe(shape) << ": " << actions.status();
    lists.push_back(actions.ok() ? *actions : std::vector<PipelineAction>{});
  }
  return lists;
}

// Megatron-LM's num_warmup_microbatches (schedules.py), written out independently of the
// library: 1F1B min(m, p - r - 1); interleaved (p - r - 1) * 2 + (v - 1) * G, capped at m v.
int MegatronWarmup(const PipelineShape& shape, int rank) {
  const int p = shape.stages, v = shape.virtual_stages, m = shape.micro_batches;
  if (shape.schedule == PipelineSchedule::kGpipe) return m;
  if (v == 1) return std::min(m, p - rank - 1);
  return std::min(m * v, (p - rank - 1) * 2 + (v - 1) * InterleavedGroupSize(shape));
}

// The property test: every schedule, p in 1..8, v in 1..4 (interleaved; the others
// take v = 1), m in {1, p, 2p + 1}.
TEST(PipelineScheduleTest, EveryShapeRunsWithoutDeadlockAndKeepsMegatronsOrder) {
  int shapes = 0;
  for (PipelineSchedule schedule : kAllSchedules) {
    for (int p = 1; p <= 8; ++p) {
      for (int v = 1; v <= 4; ++v) {
        if (v > 1 && schedule != PipelineSchedule::kInterleaved) continue;
        for (int m : {1, p, 2 * p + 1}) {
          const PipelineShape shape{schedule, p, v, m};
          ASSERT_TRUE(CheckPipelineShape(shape).ok()) << Describe(shape);
          const auto lists = AllStages(shape);
          const Simulation sim = Simulate(shape, lists);
          ASSERT_EQ(sim.error, "") << Describe(shape);
          for (int s = 0; s < p; ++s) {
            SCOPED_TRACE(absl::StrCat(Describe(shape), " stage ", s));
            EXPECT_EQ(WarmupForwards(shape, s), MegatronWarmup(shape, s));
            // The steady phase starts with a forward: one more before the first backward, and
            // held at once.
            const int steady_start = std::min(m * v, MegatronWarmup(shape, s) + 1);
            EXPECT_EQ(sim.forwards_before_backward[s], steady_start);
            EXPECT_EQ(sim.max_live[s], steady_start);
            // The memory bound: 1F1B holds at most p micro-batches; gpipe all m.
            if (schedule == PipelineSchedule::kOneFOneB) {
              EXPECT_LE(sim.max_live[s], p);
            }
            if (schedule == PipelineSchedule::kGpipe) {
              EXPECT_EQ(sim.max_live[s], m);
            }
            // After the warm-up, forwards and backwards alternate until the forwards run out.
            std::vector<bool> forwards;
            for (const PipelineAction& a : lists[s]) {
              if (a.kind == Kind::kForward || a.kind == Kind::kBackward) {
                forwards.push_back(a.kind == Kind::kForward);
              }
            }
            const int warmup = MegatronWarmup(shape, s), total = m * v;
            ASSERT_EQ(static_cast<int>(forwards.size()), 2 * total);
            for (int i = 0; i < 2 * total; ++i) {
              const bool expected = i < warmup || (i < 2 * total - warmup && (i - warmup) % 2 == 0);
              ASSERT_EQ(forwards[i], expected) << "compute " << i;
            }
          }
          ++shapes;
        }
      }
    }
  }
  EXPECT_EQ(shapes, 3 * (8 + 8 + 8 * 4));  // three m per (schedule, p, v)
}

// Beyond the m: every micro-batch count up to 3p + 2, where a short last group of
// interleaving would deadlock with Megatron-LM's G = p.
TEST(PipelineScheduleTest, InterleavedRunsEveryMicroBatchCount) {
  for (int p = 1; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = 1; m <= 3 * p + 2; ++m) {
        const PipelineShape shape{PipelineSchedule::kInterleaved, p, v, m};
        ASSERT_EQ(Simulate(shape, AllStages(shape)).error, "") << Describe(shape);
      }
    }
  }
}

// Megatron-LM's G = p deadlocks on a short last group; the simulator sees it, which is why
// InterleavedGroupSize moves to p + 1 here.
TEST(PipelineScheduleTest, InterleavedGroupSizeAvoidsAShortLastGroup) {
  EXPECT_EQ(InterleavedGroupSize({PipelineSchedule::kInterleaved, 4, 3, 8}), 4);
  EXPECT_EQ(InterleavedGroupSize({PipelineSchedule::kInterleaved, 4, 3, 9}), 5);
  // m = 11: G = 4 leaves 3 and 5 leaves 1, both short of p; 6 leaves 5.
  EXPECT_EQ(InterleavedGroupSize({PipelineSchedule::kInterleaved, 4, 3, 11}), 6);
  EXPECT_EQ(InterleavedGroupSize({PipelineSchedule::kInterleaved, 4, 3, 2}), 2);
  EXPECT_EQ(InterleavedGroupSize({PipelineSchedule::kInterleaved, 4, 3, 5}), 5);
}

// The simulator finds what it is there to find: a swapped pair of sends (the receiver would
// take one micro-batch's activation for another) and a missing send (a deadlock).
TEST(PipelineScheduleTest, SimulatorCatchesMismatchedAndMissingSends) {
  const PipelineShape shape{PipelineSchedule::kOneFOneB, 2, 1, 3};
  auto lists = AllStages(shape);
  ASSERT_EQ(Simulate(shape, lists).error, "");

  auto swapped = lists;
  std::vector<PipelineAction>& stage0 = swapped[0];
  auto first = std::find_if(stage0.begin(), stage0.end(),
                            [](const PipelineAction& a) { return a.kind == Kind::kSendForward; });
  auto second = std::find_if(first + 1, stage0.end(),
                             [](const PipelineAction& a) { return a.kind == Kind::kSendForward; });
  std::iter_swap(first, second);
  EXPECT_THAT(Simulate(shape, swapped).error,
              HasSubstr("F0.0: its receive matched the peer's sendF1.0->1"));

  auto missing = lists;
  missing[1].erase(
      std::find_if(missing[1].rbegin(), missing[1].rend(),
                   [](const PipelineAction& a) { return a.kind == Kind::kSendBackward; })
          .base() -
      1);
  EXPECT_THAT(Simulate(shape, missing).error, HasSubstr("deadlock: stage 0 at B2.0"));
}

TEST(PipelineScheduleTest, OneFOneBListsMatchMegatronsOrder) {
  const PipelineShape shape{PipelineSchedule::kOneFOneB, 3, 1, 4};
  // Stage 0: warm-up of 2, steady F2 B0, F3 B1, cool-down B2 B3.
  EXPECT_EQ(
      Formatted(*StageActions(shape, 0)),
      (std::vector<std::string>{"F0.0", "sendF0.0->1", "F1.0", "sendF1.0->1", "F2.0", "sendF2.0->1",
                                "recvB0.0<-1", "B0.0", "F3.0", "sendF3.0->1", "recvB1.0<-1", "B1.0",
                                "recvB2.0<-1", "B2.0", "recvB3.0<-1", "B3.0"}));
  // The last stage has no warm-up: strictly F, B.
  EXPECT_EQ(
      Formatted(*StageActions(shape, 2)),
      (std::vector<std::string>{"recvF0.0<-1", "F0.0", "B0.0", "sendB0.0->1", "recvF1.0<-1", "F1.0",
                                "B1.0", "sendB1.0->1", "recvF2.0<-1", "F2.0", "B2.0", "sendB2.0->1",
                                "recvF3.0<-1", "F3.0", "B3.0", "sendB3.0->1"}));
}

TEST(PipelineScheduleTest, InterleavedWrapsChunksAroundTheStages) {
  // p = 2, v = 2: model chunks 0 and 2 on stage 0, 1 and 3 on stage 1. Stage 0's warm-up is
  // 2 (p - 1) + (v - 1) p = 4: chunk 0 of micro-batches 0 and 1, then their chunk 1, whose
  // input comes back from stage 1.
  const PipelineShape shape{PipelineSchedule::kInterleaved, 2, 2, 4};
  const std::vector<std::string> stage0 = Formatted(*StageActions(shape, 0));
  const std::vector<std::string> head(stage0.begin(), stage0.begin() + 8);
  EXPECT_EQ(head, (std::vector<std::string>{"F0.0", "sendF0.0->1", "F1.0", "sendF1.0->1",
                                            "recvF0.1<-1", "F0.1", "sendF0.1->1", "recvF1.1<-1"}));
  // Its first backward is of chunk 1 (model chunk 2), whose output gradient comes from stage 1,
  // and whose input gradient goes back to stage 1's chunk 0.
  const auto first_backward = std::find(stage0.begin(), stage0.end(), "B0.1");
  ASSERT_NE(first_backward, stage0.end());
  EXPECT_EQ(*(first_backward - 1), "recvB0.1<-1");
  EXPECT_EQ(*(first_backward + 1), "sendB0.1->1");
  // Chunk 0 on stage 0 is model chunk 0: no receive before its forward, no send after its
  // backward.
  EXPECT_EQ(std::count(stage0.begin(), stage0.end(), "sendB0.0->1"), 0);
}

TEST(PipelineScheduleTest, OneStageHasNoCommunication) {
  for (PipelineSchedule schedule : kAllSchedules) {
    const PipelineShape shape{schedule, 1, schedule == PipelineSchedule::kInterleaved ? 3 : 1, 5};
    const std::vector<PipelineAction> actions = *StageActions(shape, 0);
    for (const PipelineAction& a : actions) {
      EXPECT_TRUE(a.kind == Kind::kForward || a.kind == Kind::kBackward) << FormatAction(a);
    }
  }
}

TEST(PipelineScheduleTest, InterleavedWithOneVirtualStageIs1F1B) {
  for (int m : {1, 3, 9}) {
    const PipelineShape interleaved{PipelineSchedule::kInterleaved, 4, 1, m};
    const PipelineShape one_f_one_b{PipelineSchedule::kOneFOneB, 4, 1, m};
    for (int s = 0; s < 4; ++s)
      EXPECT_EQ(*StageActions(interleaved, s), *StageActions(one_f_one_b, s));
  }
}

TEST(PipelineScheduleTest, BadShapesNameTheKeys) {
  EXPECT_THAT(CheckPipelineShape({PipelineSchedule::kOneFOneB, 4, 2, 8}).message(),
              HasSubstr("parallel.pp_virtual_stages = 2 needs parallel.pp_schedule: interleaved"));
  EXPECT_THAT(CheckPipelineShape({PipelineSchedule::kGpipe, 0, 1, 8}).message(),
              HasSubstr("parallel.pp = 0"));
  EXPECT_THAT(CheckPipelineShape({PipelineSchedule::kOneFOneB, 2, 1, 0}).message(),
              HasSubstr("train.batch_size"));
  EXPECT_THAT(StageActions({PipelineSchedule::kOneFOneB, 2, 1, 2}, 2).status().message(),
              HasSubstr("stage 2 is outside a pipeline of 2 stages"));
  EXPECT_THAT(ParsePipelineSchedule("zb").status().message(),
              HasSubstr("parallel.pp_schedule: 'zb' is not a schedule; use 1f1b"));
  for (PipelineSchedule schedule : kAllSchedules) {
    EXPECT_EQ(*ParsePipelineSchedule(PipelineScheduleName(schedule)), schedule);
  }
}

}  // namespace
}  // namespace dtrain
