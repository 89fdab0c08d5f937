// What the training engine (parallel/trainer.h) runs: the one answer the planner's search,
// `kc train --plan` and the dispatcher ask before a plan is offered or started.
#pragma once

#include "base/status.h"
#include "hal/device.h"
#include "parallel/plan.h"

namespace kc::parallel {

// Whether the trainer runs `plan` on devices of kind `device`. OkStatus, or kUnimplemented
// saying what it does not run and why:
//   zero_stage above 1 (ZeRO-2 and ZeRO-3 are planned, not built);
//   recompute with zb-h1 (the weight passes need the activations recompute drops);
//   on kCuda, anything but data parallelism (t = 1, p = 1, zero_stage 0, no recompute).
// kSimulated stands for a device the engine would run on: only the rules that hold on every
// kind. Does not check the plan against a model or a rank count (ValidatePlan does).
Status EngineSupports(const ParallelPlan& plan,
                      hal::DeviceKind device = hal::DeviceKind::kSimulated);

}  // namespace kc::parallel
