// What the L3 engine (parallel/trainer.h) can run. One answer, asked by the trainer, by kc train
// before it starts a rank, by the planner's callers for real devices, and by kcd's dispatcher
// for a job's plan: the rules are written here and nowhere else.
#pragma once

#include "base/status.h"
#include "hal/device.h"
#include "parallel/plan.h"
#include "parallel/planner/search.h"

namespace kc::parallel {

// OkStatus when the trainer runs `plan` on devices of `device` kind. kUnimplemented naming the
// first part of the plan the engine does not run there (ZeRO-2 and 3; recompute with ZB-H1; on
// CUDA devices anything but data parallelism). A simulated device runs nothing: kUnimplemented.
// Does not check the plan against a model or a world size: ValidatePlan does.
Status EngineSupports(const ParallelPlan& plan, hal::DeviceKind device);

// The planner's search constraints that keep to plans EngineSupports accepts on `device`
// (the rest of the search space as planner::SearchConstraints' defaults).
planner::SearchConstraints EngineSearchConstraints(hal::DeviceKind device);

}  // namespace kc::parallel
