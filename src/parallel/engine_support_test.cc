#include "parallel/engine_support.h"

#include <gtest/gtest.h>

namespace kc::parallel {
namespace {

using hal::DeviceKind;

TEST(EngineSupportsTest, TheCpuEngineRunsEveryLayoutWithZeroOne) {
  EXPECT_TRUE(EngineSupports({}, DeviceKind::kCpu).ok());
  EXPECT_TRUE(EngineSupports({.t = 2, .p = 2, .d = 2, .zero_stage = 1}, DeviceKind::kCpu).ok());
  EXPECT_TRUE(EngineSupports({.p = 2,
                              .micro_batches = 4,
                              .schedule = Schedule::kInterleaved,
                              .v = 2,
                              .recompute = true},
                             DeviceKind::kCpu)
                  .ok());
}

TEST(EngineSupportsTest, ZeroAboveOneAndRecomputeWithZeroBubbleAreNotBuilt) {
  EXPECT_EQ(EngineSupports({.d = 2, .zero_stage = 2}, DeviceKind::kCpu).code(),
            ErrorCode::kUnimplemented);
  EXPECT_EQ(
      EngineSupports(
          {.p = 2, .micro_batches = 2, .schedule = Schedule::kZeroBubbleH1, .recompute = true},
          DeviceKind::kCpu)
          .code(),
      ErrorCode::kUnimplemented);
  // Without a pipeline the schedule is not run: recompute alone is fine.
  EXPECT_TRUE(
      EngineSupports({.schedule = Schedule::kZeroBubbleH1, .recompute = true}, DeviceKind::kCpu)
          .ok());
}

TEST(EngineSupportsTest, OnGpusOnlyDataParallelPlansRun) {
  EXPECT_TRUE(EngineSupports({.d = 4, .micro_batches = 2}, DeviceKind::kCuda).ok());
  for (const ParallelPlan& plan :
       {ParallelPlan{.t = 2}, ParallelPlan{.p = 2, .micro_batches = 2},
        ParallelPlan{.d = 2, .zero_stage = 1}, ParallelPlan{.recompute = true}}) {
    EXPECT_EQ(EngineSupports(plan, DeviceKind::kCuda).code(), ErrorCode::kUnimplemented)
        << PlanToString(plan);
  }
  EXPECT_EQ(EngineSupports({}, DeviceKind::kSimulated).code(), ErrorCode::kUnimplemented);
}

TEST(EngineSupportsTest, ThePlannerIsKeptToWhatTheEngineRuns) {
  const planner::SearchConstraints cpu = EngineSearchConstraints(DeviceKind::kCpu);
  EXPECT_EQ(cpu.max_zero_stage, 1);
  const planner::SearchConstraints gpu = EngineSearchConstraints(DeviceKind::kCuda);
  EXPECT_EQ(gpu.fixed_t, 1);
  EXPECT_EQ(gpu.max_p, 1);
  EXPECT_FALSE(gpu.allow_recompute);
  EXPECT_EQ(gpu.max_zero_stage, 0);
}

}  // namespace
}  // namespace kc::parallel
