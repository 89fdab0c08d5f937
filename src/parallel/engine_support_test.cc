#include "parallel/engine_support.h"

#include <gtest/gtest.h>

#include <vector>

namespace kc::parallel {
namespace {

ParallelPlan Pipeline(Schedule schedule, bool recompute, int zero_stage = 0) {
  ParallelPlan plan;
  plan.p = 2;
  plan.micro_batches = 4;
  plan.schedule = schedule;
  plan.v = schedule == Schedule::kInterleaved ? 2 : 1;
  plan.recompute = recompute;
  plan.zero_stage = zero_stage;
  return plan;
}

TEST(EngineSupportsTest, RunsEveryScheduleWithAndWithoutRecomputeButZbH1WithRecompute) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved}) {
    EXPECT_TRUE(EngineSupports(Pipeline(s, false)).ok());
    EXPECT_TRUE(EngineSupports(Pipeline(s, true)).ok());
  }
  EXPECT_TRUE(EngineSupports(Pipeline(Schedule::kZeroBubbleH1, false)).ok());
  EXPECT_EQ(EngineSupports(Pipeline(Schedule::kZeroBubbleH1, true)).code(),
            ErrorCode::kUnimplemented);
}

TEST(EngineSupportsTest, WithoutAPipelineTheScheduleDoesNotMatter) {
  ParallelPlan plan;
  plan.schedule = Schedule::kZeroBubbleH1;
  plan.recompute = true;
  EXPECT_TRUE(EngineSupports(plan).ok());
}

TEST(EngineSupportsTest, RunsZeroStagesZeroAndOneOnly) {
  for (int zero : {0, 1}) EXPECT_TRUE(EngineSupports(Pipeline(Schedule::k1F1B, false, zero)).ok());
  for (int zero : {2, 3}) {
    EXPECT_EQ(EngineSupports(Pipeline(Schedule::k1F1B, false, zero)).code(),
              ErrorCode::kUnimplemented);
  }
}

TEST(EngineSupportsTest, EveryDeviceKindAnswersTheCommonRules) {
  for (hal::DeviceKind kind :
       {hal::DeviceKind::kCpu, hal::DeviceKind::kCuda, hal::DeviceKind::kSimulated}) {
    EXPECT_EQ(EngineSupports(Pipeline(Schedule::kZeroBubbleH1, true), kind).code(),
              ErrorCode::kUnimplemented);
    ParallelPlan dp;
    dp.d = 4;
    EXPECT_TRUE(EngineSupports(dp, kind).ok());
  }
  EXPECT_TRUE(EngineSupports(Pipeline(Schedule::k1F1B, true), hal::DeviceKind::kCpu).ok());
}

TEST(EngineSupportsTest, OnGpusTheEngineRunsDataParallelPlansOnly) {
  ParallelPlan plan;
  plan.d = 2;
  EXPECT_TRUE(EngineSupports(plan, hal::DeviceKind::kCuda).ok());
  for (auto change : std::vector<void (*)(ParallelPlan&)>{
           [](ParallelPlan& p) { p.t = 2; }, [](ParallelPlan& p) { p.p = 2; },
           [](ParallelPlan& p) { p.zero_stage = 1; },
           [](ParallelPlan& p) { p.recompute = true; }}) {
    ParallelPlan other = plan;
    change(other);
    EXPECT_EQ(EngineSupports(other, hal::DeviceKind::kCuda).code(), ErrorCode::kUnimplemented)
        << PlanToString(other);
    EXPECT_TRUE(EngineSupports(other, hal::DeviceKind::kSimulated).ok()) << PlanToString(other);
  }
}

TEST(EngineSupportsTest, ThePlannerIsKeptToWhatTheEngineRuns) {
  const planner::SearchConstraints cpu = EngineSearchConstraints(hal::DeviceKind::kCpu);
  EXPECT_EQ(cpu.max_zero_stage, 1);
  const planner::SearchConstraints gpu = EngineSearchConstraints(hal::DeviceKind::kCuda);
  EXPECT_EQ(gpu.fixed_t, 1);
  EXPECT_EQ(gpu.max_p, 1);
  EXPECT_FALSE(gpu.allow_recompute);
  EXPECT_EQ(gpu.max_zero_stage, 0);
}

}  // namespace
}  // namespace kc::parallel
