#include "parallel/engine_support.h"

#include <fmt/format.h>

namespace kc::parallel {

Status EngineSupports(const ParallelPlan& plan, hal::DeviceKind device) {
  // What no kind of device runs.
  if (plan.zero_stage > 1) {
    return UnimplementedError(fmt::format(
        "zero_stage {}: the engine shards the optimizer state (ZeRO-1) only; zero_stage above 1 "
        "is not built yet",
        plan.zero_stage));
  }
  // Without a pipeline the schedule names no passes (the trainer runs plain backwards).
  if (plan.recompute && plan.p > 1 && plan.schedule == Schedule::kZeroBubbleH1) {
    return UnimplementedError(
        "recompute with zb-h1 is not built (the weight passes need the activations recompute "
        "drops); recompute runs with gpipe, 1f1b and interleaved");
  }
  // What a kind of device adds.
  switch (device) {
    case hal::DeviceKind::kCuda:
      // The CUDA engine (parallel/cuda/) trains a whole model per rank.
      if (plan.t != 1 || plan.p != 1 || plan.zero_stage != 0 || plan.recompute) {
        return UnimplementedError(fmt::format(
            "on GPUs the engine runs data-parallel plans only (t=1, p=1, zero_stage 0, no "
            "recompute); this plan has t={} p={} zero_stage={}{}",
            plan.t, plan.p, plan.zero_stage, plan.recompute ? " with recompute" : ""));
      }
      break;
    case hal::DeviceKind::kCpu:
    case hal::DeviceKind::kSimulated:
      break;
  }
  return OkStatus();
}

planner::SearchConstraints EngineSearchConstraints(hal::DeviceKind device) {
  planner::SearchConstraints c;
  c.max_zero_stage = 1;
  if (device == hal::DeviceKind::kCuda) {
    c.fixed_t = 1;
    c.max_p = 1;
    c.allow_recompute = false;
    c.max_zero_stage = 0;
  }
  return c;
}

}  // namespace kc::parallel
