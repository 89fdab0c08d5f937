// What `kc train` shows: the steady-state summary, the progress line and the loss plot.
#include "apps/kc/train_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace kc::app {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<StepRecord> Steps(int n) {
  std::vector<StepRecord> steps;
  for (int i = 1; i <= n; ++i) {
    // The first step is slow (first touch); the rest take 0.5 s, 0.1 s of it communication.
    const double t = i == 1 ? 5.0 : 0.5;
    steps.push_back({.step = i,
                     .loss = 6.0 - 0.1 * i,
                     .step_s = t,
                     .compute_s = t - 0.1,
                     .comm_exposed_s = 0.1,
                     .tokens = 1000});
  }
  return steps;
}

TEST(TrainSummaryTest, LeavesOutTheFirstStepsAndAverages) {
  const TrainSummary s = Summarise(Steps(30));
  EXPECT_EQ(s.steps, 30);
  EXPECT_EQ(s.measured_steps, 27);  // 30 / 10 = 3 left out
  EXPECT_DOUBLE_EQ(s.first_loss, 5.9);
  EXPECT_NEAR(s.last_loss, 6.0 - 0.1 * 25.5, 1e-12);  // mean of steps 21..30
  EXPECT_NEAR(s.tokens_per_s, 2000, 1e-9);
  EXPECT_NEAR(s.step_ms_median, 500, 1e-9);
  EXPECT_NEAR(s.device_utilisation, 0.8, 1e-12);
  EXPECT_NEAR(s.exposed_comm_share, 0.2, 1e-12);
  EXPECT_NEAR(s.comm_exposed_ms, 100, 1e-9);
  EXPECT_NEAR(s.comm_exposed_ms_median, 100, 1e-9);
  EXPECT_NEAR(s.total_s, 5.0 + 29 * 0.5, 1e-9);
  // Short runs still leave out the first step; one step is all there is.
  EXPECT_EQ(Summarise(Steps(5)).measured_steps, 4);
  EXPECT_EQ(Summarise(Steps(1)).measured_steps, 1);
  EXPECT_EQ(Summarise(Steps(300)).measured_steps, 290);
  EXPECT_EQ(Summarise({}).steps, 0);
}

TEST(ProgressLineTest, ShowsStepLossRateAndEta) {
  const std::string line = ProgressLine(120, 300, 2.4312, 2.5031, 12345, 42, 100);
  EXPECT_THAT(line, HasSubstr("step 120/300 ["));
  EXPECT_THAT(line, HasSubstr(" 40%"));
  EXPECT_THAT(line, HasSubstr("loss 2.431"));
  EXPECT_THAT(line, HasSubstr("val 2.503"));
  EXPECT_THAT(line, HasSubstr("12.3k tok/s"));
  EXPECT_THAT(line, HasSubstr("ETA 0:42"));
  EXPECT_LE(line.size(), 100u);
  // No validation yet; a narrow terminal drops the bar, never the numbers' start.
  EXPECT_THAT(ProgressLine(1, 300, 5.6, -1, 900, 3700, 100), Not(HasSubstr("val")));
  const std::string narrow = ProgressLine(1, 300, 5.6, -1, 900, 3700, 40);
  EXPECT_LE(narrow.size(), 40u);
  EXPECT_THAT(narrow, HasSubstr("step   1/300"));
}

TEST(FormatDurationTest, MinutesAndHours) {
  EXPECT_EQ(FormatDuration(0), "0:00");
  EXPECT_EQ(FormatDuration(65), "1:05");
  EXPECT_EQ(FormatDuration(43389), "12:03:09");
  EXPECT_EQ(FormatDuration(-1), "?");
}

TEST(LossCurveSvgTest, PlotsTrainAndValidation) {
  const std::string svg = LossCurveSvg("gpt-tiny", Steps(20), {{10, 5.0}, {20, 4.5}});
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr(">gpt-tiny</text>"));
  EXPECT_THAT(svg, HasSubstr("<polyline"));
  EXPECT_THAT(svg, HasSubstr("<circle"));
  EXPECT_THAT(svg, HasSubstr("validation"));
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  // Nothing to plot is still a valid document.
  EXPECT_THAT(LossCurveSvg("empty", {}, {}), HasSubstr("</svg>"));
}

// TensorBoard's debiased smoothing: a steep early drop is followed within a few steps, not
// dragged towards the first loss for dozens (a plain EMA started at the first loss kept 0.9^9
// = 39% of it after 10 steps).
TEST(SmoothedLossesTest, AreDebiasedSoTheFirstStepsAreNotDraggedBack) {
  std::vector<StepRecord> steps;
  for (int i = 1; i <= 10; ++i) steps.push_back({.step = i, .loss = i == 1 ? 10.0 : 1.0});
  const std::vector<double> s = SmoothedLosses(steps);
  ASSERT_EQ(s.size(), 10u);
  EXPECT_DOUBLE_EQ(s[0], 10.0);  // one value: itself
  // After n values, the first one weighs 0.1 * 0.9^(n-1) / (1 - 0.9^n).
  const double w = 0.1 * std::pow(0.9, 9) / (1 - std::pow(0.9, 10));
  EXPECT_NEAR(s[9], w * 10.0 + (1 - w) * 1.0, 1e-12);
  EXPECT_LT(s[9], 1.6);
  // A constant loss is smoothed to itself from the first step on.
  for (StepRecord& r : steps) r.loss = 3.0;
  for (double v : SmoothedLosses(steps)) EXPECT_NEAR(v, 3.0, 1e-12);
  // Non-finite losses are skipped, not averaged in.
  steps[4].loss = std::nan("");
  const std::vector<double> with_nan = SmoothedLosses(steps);
  EXPECT_TRUE(std::isnan(with_nan[4]));
  EXPECT_NEAR(with_nan[5], 3.0, 1e-12);
}

}  // namespace
}  // namespace kc::app
