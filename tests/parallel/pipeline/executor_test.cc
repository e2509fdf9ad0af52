#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/comm/faulty_ranks.h"
#include "tests/parallel/comm/test_store.h"

namespace dtrain {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr int kElements = 5;  // per activation

std::string Describe(const PipelineShape& shape) {
  return absl::StrCat(PipelineScheduleName(shape.schedule), " p=", shape.stages,
                      " v=", shape.virtual_stages, " m=", shape.micro_batches);
}

// Model chunk k's weights, in {2, -1, 1}: at most every third factor doubles, so every value
// below (activations, gradients, their sums over micro-batches and steps) is an integer under
// 2^24, and float and double compute them exactly, in any order.
double Weight(int model_chunk, int i) {
  constexpr double kWeights[] = {2, -1, 1};
  return kWeights[(model_chunk + i) % 3];
}
// Model chunk 0's input for a micro-batch.
double Data(int micro_batch, int i) { return micro_batch + i + 1; }

// Model chunk k computes y = w_k * x + k elementwise; the loss is the sum of the last chunk's
// outputs. The backward keeps no copy of its input: it reads the executor's buffer through the
// pointer Forward got, which the executor must keep alive and unchanged until then.
class AffineStage : public PipelineStage {
 public:
  AffineStage(const PipelineShape& shape, int stage)
      : shape_(shape), stage_(stage), grads_(shape.virtual_stages, std::vector<float>(kElements)) {}

  DataType ActivationType() const override { return DataType::kF32; }
  size_t InputCount(int chunk) const override { return ModelChunk(chunk) == 0 ? 0 : kElements; }
  size_t OutputCount(int chunk) const override { return IsLast(chunk) ? 0 : kElements; }

  absl::Status Forward(int micro_batch, int chunk, ConstValues input_values,
                       Values output_values) override {
    if (absl::Status status = Fault(); !status.ok()) return status;
    const float* input = input_values.as<float>();
    float* output = output_values.as<float>();
    const int k = ModelChunk(chunk);
    if ((input == nullptr) != (k == 0) || (output == nullptr) != IsLast(chunk)) {
      return absl::InternalError(absl::StrCat("F", micro_batch, ".", chunk, ": wrong buffers"));
    }
    inputs_[{micro_batch, chunk}] = input;
    for (int i = 0; i < kElements; ++i) {
      const float x = input != nullptr ? input[i] : static_cast<float>(Data(micro_batch, i));
      const float y = static_cast<float>(Weight(k, i)) * x + static_cast<float>(k);
      if (output != nullptr) {
        output[i] = y;
      } else {
        loss_ += y;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Backward(int micro_batch, int chunk, ConstValues d_output_values,
                        Values d_input_values) override {
    if (absl::Status status = Fault(); !status.ok()) return status;
    const float* d_output = d_output_values.as<float>();
    float* d_input = d_input_values.as<float>();
    const int k = ModelChunk(chunk);
    auto it = inputs_.find({micro_batch, chunk});
    if (it == inputs_.end()) {
      return absl::InternalError(absl::StrCat("B", micro_batch, ".", chunk, " before F"));
    }
    const float* input = it->second;
    inputs_.erase(it);
    for (int i = 0; i < kElements; ++i) {
      const float dy = d_output != nullptr ? d_output[i] : 1.0f;
      const float x = input != nullptr ? input[i] : static_cast<float>(Data(micro_batch, i));
      grads_[chunk][i] += x * dy;
      if (d_input != nullptr) d_input[i] = static_cast<float>(Weight(k, i)) * dy;
    }
    return absl::OkStatus();
  }

  // Every compute sleeps `delay` first: a slow stage.
  void SlowDown(absl::Duration delay) { delay_ = delay; }

  // The compute with this index (0-based, over forwards and backwards) sleeps `hang`, then
  // fails: a stage that dies (no hang) or hangs mid-schedule.
  void FailAtCompute(int index, absl::Duration hang) {
    fail_at_ = index;
    hang_ = hang;
  }

  float loss() const { return loss_; }
  const std::vector<float>& grad(int chunk) const { return grads_[chunk]; }
  int ModelChunk(int chunk) const { return chunk * shape_.stages + stage_; }

 private:
  bool IsLast(int chunk) const {
    return ModelChunk(chunk) == shape_.stages * shape_.virtual_stages - 1;
  }
  absl::Status Fault() {
    absl::SleepFor(delay_);
    if (computes_++ != fail_at_) return absl::OkStatus();
    absl::SleepFor(hang_);
    return absl::InternalError("injected failure");
  }

  const PipelineShape shape_;
  const int stage_;
  std::map<std::pair<int, int>, const float*> inputs_;
  std::vector<std::vector<float>> grads_;  // per chunk on this stage
  float loss_ = 0;
  int computes_ = 0;
  int fail_at_ = -1;
  absl::Duration hang_;
  absl::Duration delay_;
};

// The closed form, in double, without the pipeline: per model chunk the weight gradient, and
// the loss, of one step. x_0 = data, x_{k+1} = w_k x_k + k, dL/dx_K = 1 at the last chunk's
// output, dL/dx_k = w_k dL/dx_{k+1}, dL/dw_k = sum over micro-batches of x_k dL/dx_{k+1}.
struct Expected {
  std::vector<std::vector<double>> grads;  // per model chunk
  double loss = 0;
};
Expected ClosedForm(const PipelineShape& shape) {
  const int chunks = shape.stages * shape.virtual_stages;
  Expected expected;
  expected.grads.assign(chunks, std::vector<double>(kElements, 0));
  for (int mb = 0; mb < shape.micro_batches; ++mb) {
    for (int i = 0; i < kElements; ++i) {
      std::vector<double> x(chunks + 1);
      x[0] = Data(mb, i);
      for (int k = 0; k < chunks; ++k) x[k + 1] = Weight(k, i) * x[k] + k;
      expected.loss += x[chunks];
      double dy = 1;
      for (int k = chunks - 1; k >= 0; --k) {
        expected.grads[k][i] += x[k] * dy;
        dy *= Weight(k, i);
      }
    }
  }
  return expected;
}

struct StageResult {
  absl::Status status;
  std::vector<std::vector<float>> grads;  // per chunk on the stage
  float loss = 0;
  PipelineExecutorStats stats;
  absl::Duration elapsed;
};

// Runs `steps` steps of `shape` on one thread per stage with real Gloo communicators;
// `prepare` may arm a stage's fault.
template <typename Prepare>
std::vector<StageResult> RunPipeline(const PipelineShape& shape, int steps, absl::Duration timeout,
                                     Prepare prepare) {
  std::vector<StageResult> results(shape.stages);
  testing::RunRanksInThreads(shape.stages, timeout, [&](Communicator& comm) {
    const int s = comm.rank();
    StageResult& result = results[s];
    AffineStage stage(shape, s);
    prepare(s, stage);
    CpuBackend backend(1);
    absl::StatusOr<std::unique_ptr<PipelineExecutor>> executor =
        PipelineExecutor::Create(shape, s, &comm, backend);
    ASSERT_TRUE(executor.ok()) << executor.status();
    const absl::Time start = absl::Now();
    for (int step = 0; step < steps && result.status.ok(); ++step) {
      result.status = (*executor)->RunStep(stage);
    }
    result.elapsed = absl::Now() - start;
    result.stats = (*executor)->stats();
    for (int c = 0; c < shape.virtual_stages; ++c) result.grads.push_back(stage.grad(c));
    result.loss = stage.loss();
  });
  return results;
}

std::vector<StageResult> RunPipeline(const PipelineShape& shape, int steps) {
  // Healthy runs never time out; the bound only ends a broken test.
  return RunPipeline(shape, steps, absl::Seconds(60), [](int, AffineStage&) {});
}

// The matrix: every schedule, p in 1..4, v in {1, 2} (interleaved), m in {1, p, 2p + 1};
// two steps, so that pooled buffers are reused. Every stage's weight gradients and the loss are
// exactly twice the closed form: each activation and gradient landed in the buffer of its
// micro-batch and chunk.
TEST(PipelineExecutorTest, EveryScheduleGivesTheClosedFormGradientsAndLoss) {
  constexpr int kSteps = 2;
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB, PipelineSchedule::kInterleaved}) {
    for (int p = 1; p <= 4; ++p) {
      for (int v : {1, 2}) {
        if (v > 1 && schedule != PipelineSchedule::kInterleaved) continue;
        for (int m : {1, p, 2 * p + 1}) {
          const PipelineShape shape{schedule, p, v, m};
          SCOPED_TRACE(Describe(shape));
          const Expected expected = ClosedForm(shape);
          const std::vector<StageResult> results = RunPipeline(shape, kSteps);
          for (int s = 0; s < p; ++s) {
            const StageResult& result = results[s];
            SCOPED_TRACE(absl::StrCat("stage ", s));
            ASSERT_TRUE(result.status.ok()) << result.status;
            for (int c = 0; c < v; ++c) {
              for (int i = 0; i < kElements; ++i) {
                EXPECT_EQ(result.grads[c][i], kSteps * expected.grads[c * p + s][i])
                    << "chunk " << c << " element " << i;
              }
            }
            // Every buffer holds one activation or gradient of kElements floats.
            EXPECT_EQ(result.stats.peak_buffer_bytes,
                      result.stats.peak_buffers_in_use * kElements * sizeof(float));
            // The executor holds what the schedule says: warm-up + 1 micro-batches at once.
            EXPECT_EQ(result.stats.peak_live_activations,
                      std::min(m * v, WarmupForwards(shape, s) + 1));
            if (schedule == PipelineSchedule::kOneFOneB) {
              EXPECT_LE(result.stats.peak_live_activations, p);
            }
            if (schedule == PipelineSchedule::kGpipe) {
              EXPECT_EQ(result.stats.peak_live_activations, m);
            }
          }
          EXPECT_EQ(results[p - 1].loss, kSteps * expected.loss);
        }
      }
    }
  }
}

// 1F1B's point: memory does not grow with the micro-batches. The executor's buffers (inputs
// kept for backward, received gradients, sends in flight) are the same for m = 2p + 1 as for
// m = 4p + 1 on every stage.
TEST(PipelineExecutorTest, OneFOneBBuffersDoNotGrowWithMicroBatches) {
  constexpr int p = 4;
  const std::vector<StageResult> fewer =
      RunPipeline({PipelineSchedule::kOneFOneB, p, 1, 2 * p + 1}, 1);
  const std::vector<StageResult> more =
      RunPipeline({PipelineSchedule::kOneFOneB, p, 1, 4 * p + 1}, 1);
  for (int s = 0; s < p; ++s) {
    SCOPED_TRACE(absl::StrCat("stage ", s));
    ASSERT_TRUE(fewer[s].status.ok()) << fewer[s].status;
    ASSERT_TRUE(more[s].status.ok()) << more[s].status;
    EXPECT_EQ(more[s].stats.peak_live_activations, p - s);
    EXPECT_EQ(more[s].stats.peak_buffers_in_use, fewer[s].stats.peak_buffers_in_use);
    EXPECT_EQ(more[s].stats.buffers_allocated, fewer[s].stats.buffers_allocated);
  }
  // Gpipe, for contrast, holds every micro-batch's input on the stages that receive one.
  const std::vector<StageResult> gpipe =
      RunPipeline({PipelineSchedule::kGpipe, p, 1, 4 * p + 1}, 1);
  for (int s = 1; s < p; ++s) {
    EXPECT_GT(gpipe[s].stats.peak_buffers_in_use, more[s].stats.peak_buffers_in_use);
  }
}

// The step's timings: a slow first stage (every compute sleeps) leaves the second stage waiting
// for its inputs for most of the step, while the first stage computes for most of its own. Each
// stage's waits and computes are disjoint parts of its step. Bounds, not measurements: the
// sleeps alone are 8 x 50 ms per step on stage 0, and stage 1 computes in microseconds.
TEST(PipelineExecutorTest, AStageDownstreamOfASlowOneWaitsForMostOfItsStep) {
  constexpr absl::Duration kDelay = absl::Milliseconds(50);
  const PipelineShape shape{PipelineSchedule::kOneFOneB, 2, 1, 4};
  const std::vector<StageResult> results =
      RunPipeline(shape, 2, absl::Seconds(60), [&](int s, AffineStage& stage) {
        if (s == 0) stage.SlowDown(kDelay);
      });
  for (int s = 0; s < shape.stages; ++s) {
    SCOPED_TRACE(absl::StrCat("stage ", s));
    ASSERT_TRUE(results[s].status.ok()) << results[s].status;
    const PipelineExecutorStats& stats = results[s].stats;
    EXPECT_GT(stats.step_ms, 0);
    // Sums of disjoint intervals of the step, each converted from integer nanoseconds: within
    // the step up to the rounding of the conversions (1e-6 ms is far above it).
    EXPECT_LE(stats.wait_ms + stats.compute_ms, stats.step_ms + 1e-6);
  }
  const PipelineExecutorStats& slow = results[0].stats;
  const PipelineExecutorStats& waiting = results[1].stats;
  // Stage 0's 4 forwards and 4 backwards each sleep kDelay inside the compute.
  EXPECT_GE(slow.compute_ms, 8 * absl::ToDoubleMilliseconds(kDelay));
  EXPECT_GT(slow.compute_ms, slow.wait_ms);
  // Stage 1 waits for each of stage 0's forwards (at least 4 x kDelay of its step).
  EXPECT_GT(waiting.wait_ms, 0.5 * waiting.step_ms);
  EXPECT_GT(waiting.wait_ms, waiting.compute_ms);
  EXPECT_GT(waiting.wait_ms / waiting.step_ms, slow.wait_ms / slow.step_ms);
}

TEST(PipelineExecutorTest, StepTimesSumStepsAndStateTheIdleShare) {
  PipelineStepTimes times;
  times.Add({.step_ms = 300, .compute_ms = 200, .wait_ms = 90});
  times.Add({.step_ms = 100, .compute_ms = 80, .wait_ms = 10});
  EXPECT_EQ(times.steps, 2);
  EXPECT_EQ(times.Format(), "waited 100.0 ms of 400.0 ms (25.0%) in 2 steps, computing 280.0 ms");
}

// A stage that hangs mid-schedule (sleeps past the timeout, then fails) or dies (fails at once,
// and its communicator closes): every other stage fails too, within the timeout of each wait,
// and the hung stage's neighbours name it.
TEST(PipelineExecutorTest, AHungOrDeadStageFailsEveryStageNamingIt) {
  constexpr absl::Duration kTimeout = absl::Seconds(2);
  for (const absl::Duration hang : {3 * kTimeout, absl::ZeroDuration()}) {
    const PipelineShape shape{PipelineSchedule::kOneFOneB, 4, 1, 5};
    constexpr int kFaulty = 2;
    SCOPED_TRACE(absl::StrCat("hang ", absl::FormatDuration(hang)));
    const std::vector<StageResult> results =
        RunPipeline(shape, 1, kTimeout, [&](int s, AffineStage& stage) {
          // Its third compute: stage 2 has run F0, F1 and sent F0 (1F1B warm-up 1).
          if (s == kFaulty) stage.FailAtCompute(2, hang);
        });
    EXPECT_THAT(results[kFaulty].status.message(), HasSubstr("injected failure"));
    for (int s = 0; s < shape.stages; ++s) {
      SCOPED_TRACE(absl::StrCat("stage ", s));
      EXPECT_FALSE(results[s].status.ok());
      EXPECT_THAT(results[s].status.message(),
                  HasSubstr(absl::StrCat("pipeline stage ", s, " of 4")));
      // A generous cap, not a measurement: a hang would never end.
      EXPECT_LT(results[s].elapsed, absl::Seconds(60));
    }
    for (int s : {kFaulty - 1, kFaulty + 1}) {
      EXPECT_THAT(std::string(results[s].status.message()),
                  ContainsRegex(absl::StrCat("(from|to) stage ", kFaulty, " failed")))
          << "stage " << s;
      EXPECT_EQ(FaultyRanks(results[s].status), std::vector<int>{kFaulty}) << "stage " << s;
    }
  }
}

TEST(PipelineExecutorTest, CreateChecksTheGroupAgainstTheShape) {
  CpuBackend backend(1);
  EXPECT_THAT(PipelineExecutor::Create({PipelineSchedule::kOneFOneB, 2, 1, 2}, 0, nullptr, backend)
                  .status()
                  .message(),
              HasSubstr("pipeline stage 0 of 2: the pipeline group needs 2 ranks"));
  EXPECT_THAT(PipelineExecutor::Create({PipelineSchedule::kOneFOneB, 2, 2, 2}, 0, nullptr, backend)
                  .status()
                  .message(),
              HasSubstr("parallel.pp_virtual_stages"));
  testing::RunRanksInThreads(3, absl::Seconds(60), [&backend](Communicator& comm) {
    EXPECT_THAT(PipelineExecutor::Create({PipelineSchedule::kOneFOneB, 2, 1, 2}, 0, &comm, backend)
                    .status()
                    .message(),
                HasSubstr("group 'world' has 3 ranks"));
  });
  // One stage moves nothing and needs no group.
  EXPECT_TRUE(
      PipelineExecutor::Create({PipelineSchedule::kInterleaved, 1, 3, 2}, 0, nullptr, backend)
          .ok());
}

}  // namespace
}  // namespace dtrain
