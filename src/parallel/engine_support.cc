#include "parallel/engine_support.h"

#include <fmt/format.h>

namespace kc::parallel {

Status EngineSupports(const ParallelPlan& plan, hal::DeviceKind device) {
  if (device == hal::DeviceKind::kSimulated) {
    return UnimplementedError("the engine runs nothing on simulated devices");
  }
  if (plan.zero_stage > 1) {
    return UnimplementedError(fmt::format(
        "zero_stage {}: the engine shards the optimizer state (ZeRO-1) only; zero_stage above 1 "
        "is not built yet",
        plan.zero_stage));
  }
  if (plan.recompute && plan.p > 1 && plan.schedule == Schedule::kZeroBubbleH1) {
    return UnimplementedError(
        "recompute with zb-h1 is not built yet (the weight passes need the activations "
        "recompute drops)");
  }
  if (device == hal::DeviceKind::kCuda &&
      (plan.t != 1 || plan.p != 1 || plan.zero_stage != 0 || plan.recompute)) {
    return UnimplementedError(
        fmt::format("on GPUs the engine runs data-parallel plans only (t=1, p=1, zero_stage 0, no "
                    "recompute); this plan has t={} p={} zero_stage={}{}",
                    plan.t, plan.p, plan.zero_stage, plan.recompute ? " with recompute" : ""));
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
