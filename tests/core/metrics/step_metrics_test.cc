// metrics.jsonl lines: what StepMetricsJson writes, ParseStepMetricsJson reads back.
#include "core/metrics/step_metrics.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

StepMetrics EveryField() {
  StepMetrics m;
  m.step = 12;
  m.loss = 2.345678901234;
  m.lr = 1.5e-4;
  m.grad_norm = 0.8125;
  m.time = 1796400000.125;
  m.step_ms = 312.25;
  m.tokens_per_s = 6553.6;
  m.mfu_percent = 41.2;
  m.exposed_comm_ms = 3.1;
  m.data_wait_ms = 0.1;
  m.pp_wait_ms = 5.5;
  m.dp_sent_bytes = int64_t{1} << 40;
  m.tp_sent_bytes = 7;
  m.pp_sent_bytes = 9;
  m.peak_rss_mib = 312.5;
  m.eta_s = 92;
  m.val_loss = 2.1;
  m.ckpt_blocked_ms = 4.2;
  m.resumed_from_step = 10;
  m.peak_gflops = 126.25;
  return m;
}

// A step faster than the start-up GEMM (measured on a busy machine) raises the peak: MFU never
// reads above 100% (144.6% was seen), and later steps are stated against the new peak.
TEST(MfuPercentTest, AStepAboveThePeakRaisesIt) {
  double peak = 100e9;
  bool raised = true;
  EXPECT_DOUBLE_EQ(MfuPercent(50e9, peak, raised), 50.0);
  EXPECT_FALSE(raised);
  EXPECT_DOUBLE_EQ(MfuPercent(144.6e9, peak, raised), 100.0);
  EXPECT_TRUE(raised);
  EXPECT_DOUBLE_EQ(peak, 144.6e9);
  EXPECT_DOUBLE_EQ(MfuPercent(72.3e9, peak, raised), 50.0);
  EXPECT_FALSE(raised);
}

TEST(StepMetricsJsonTest, ReadsBackEveryFieldItWrote) {
  const StepMetrics m = EveryField();
  const absl::StatusOr<StepMetrics> read = ParseStepMetricsJson(StepMetricsJson(m));
  ASSERT_TRUE(read.ok()) << read.status();
  // JSON numbers print round-trip exact, so the doubles come back bit for bit.
  EXPECT_EQ(read->step, m.step);
  EXPECT_EQ(read->loss, m.loss);
  EXPECT_EQ(read->lr, m.lr);
  EXPECT_EQ(read->grad_norm, m.grad_norm);
  EXPECT_EQ(read->time, m.time);
  EXPECT_EQ(read->step_ms, m.step_ms);
  EXPECT_EQ(read->tokens_per_s, m.tokens_per_s);
  EXPECT_EQ(read->mfu_percent, m.mfu_percent);
  EXPECT_EQ(read->exposed_comm_ms, m.exposed_comm_ms);
  EXPECT_EQ(read->data_wait_ms, m.data_wait_ms);
  EXPECT_EQ(read->pp_wait_ms, m.pp_wait_ms);
  EXPECT_EQ(read->dp_sent_bytes, m.dp_sent_bytes);
  EXPECT_EQ(read->tp_sent_bytes, m.tp_sent_bytes);
  EXPECT_EQ(read->pp_sent_bytes, m.pp_sent_bytes);
  EXPECT_EQ(read->peak_rss_mib, m.peak_rss_mib);
  EXPECT_EQ(read->eta_s, m.eta_s);
  EXPECT_EQ(read->val_loss, m.val_loss);
  EXPECT_EQ(read->ckpt_blocked_ms, m.ckpt_blocked_ms);
  EXPECT_EQ(read->resumed_from_step, m.resumed_from_step);
  EXPECT_EQ(read->peak_gflops, m.peak_gflops);
}

TEST(StepMetricsJsonTest, OptionalFieldsStayAbsent) {
  StepMetrics m = EveryField();
  m.val_loss.reset();
  m.ckpt_blocked_ms.reset();
  m.resumed_from_step.reset();
  m.peak_gflops.reset();
  const std::string line = StepMetricsJson(m);
  EXPECT_THAT(line, ::testing::Not(HasSubstr("resumed_from_step")));
  const absl::StatusOr<StepMetrics> read = ParseStepMetricsJson(line);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->val_loss);
  EXPECT_FALSE(read->ckpt_blocked_ms);
  EXPECT_FALSE(read->resumed_from_step);
  EXPECT_FALSE(read->peak_gflops);
}

// A run killed while writing leaves a line cut anywhere: every such prefix is an error, not a
// crash and not a step.
TEST(StepMetricsJsonTest, EveryCutShortLineIsAnError) {
  const std::string line = StepMetricsJson(EveryField());
  for (size_t length = 0; length < line.size(); ++length) {
    EXPECT_FALSE(ParseStepMetricsJson(line.substr(0, length)).ok()) << line.substr(0, length);
  }
}

TEST(StepMetricsJsonTest, ADivergedLossReadsBackAsNaN) {
  StepMetrics m = EveryField();
  m.loss = std::numeric_limits<double>::quiet_NaN();
  const absl::StatusOr<StepMetrics> read = ParseStepMetricsJson(StepMetricsJson(m));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(std::isnan(read->loss));
}

TEST(StepMetricsJsonTest, AnOlderLineWithFewerKeysReads) {
  const absl::StatusOr<StepMetrics> read = ParseStepMetricsJson(R"({"step":3,"loss":2.5})");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 3);
  EXPECT_EQ(read->loss, 2.5);
  EXPECT_EQ(read->pp_wait_ms, 0);
}

TEST(StepMetricsJsonTest, AMissingOrMistypedKeyIsNamed) {
  EXPECT_THAT(ParseStepMetricsJson(R"({"loss":2.5})").status().message(), HasSubstr("\"step\""));
  EXPECT_THAT(ParseStepMetricsJson(R"({"step":1,"loss":"2.5"})").status().message(),
              HasSubstr("\"loss\" is not a number"));
  EXPECT_THAT(ParseStepMetricsJson(R"({"step":1,"loss":2,"val_loss":[1]})").status().message(),
              HasSubstr("\"val_loss\""));
  EXPECT_FALSE(ParseStepMetricsJson("[1,2]").ok());
}

}  // namespace
}  // namespace dtrain
