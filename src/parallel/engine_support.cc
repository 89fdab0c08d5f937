#include "parallel/engine_support.h"

namespace kc::parallel {

Status EngineSupports(const ParallelPlan& plan, hal::DeviceKind device) {
  // What no kind of device runs.
  if (plan.zero_stage > 1) {
    return UnimplementedError("zero_stage above 1 is not built yet (ZeRO-1 is)");
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
        return UnimplementedError(
            "on GPUs the engine runs data-parallel plans only (t=1, p=1, zero_stage 0, no "
            "recompute)");
      }
      break;
    case hal::DeviceKind::kCpu:
    case hal::DeviceKind::kSimulated:
      break;
  }
  return OkStatus();
}

}  // namespace kc::parallel
