// What the L3 engine (parallel/trainer.h) runs: one answer, asked by the trainer, by kc train
// before it starts a rank, by the planner's search for every plan it offers, and by kcd for a
// job file's plan; the rules are written here and nowhere else.
#pragma once

#include "base/status.h"
#include "hal/device.h"
#include "parallel/plan.h"
#include "parallel/planner/search.h"

namespace kc::parallel {

// Whether the trainer runs `plan` on devices of kind `device`. OkStatus, or kUnimplemented
// naming the first part of the plan it does not run there and why:
//   zero_stage above 1 (ZeRO-2 and ZeRO-3 are planned, not built);
//   recompute with zb-h1 (the weight passes need the activations recompute drops);
//   on kCuda, anything but data parallelism (t = 1, p = 1, zero_stage 0, no recompute).
// kSimulated stands for a device the engine would run on: only the rules that hold on every
// kind. Does not check the plan against a model or a rank count (ValidatePlan does).
Status EngineSupports(const ParallelPlan& plan,
                      hal::DeviceKind device = hal::DeviceKind::kSimulated);

// The planner's search constraints that keep to plans EngineSupports accepts on `device` (the
// rest of the search space as planner::SearchConstraints' defaults), for callers that narrow
// the search further.
planner::SearchConstraints EngineSearchConstraints(hal::DeviceKind device);

}  // namespace kc::parallel
