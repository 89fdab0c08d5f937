// `kc plan`: the planner for people and tools; and the local planning `kc train --plan auto`
// shares with it.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "apps/kc/command.h"
#include "base/status.h"
#include "parallel/model_spec.h"
#include "parallel/planner/cluster.h"
#include "parallel/planner/search.h"

namespace kc::app {

// Registers `plan` on `app`; the parsed command is stored in *action.
void AddPlanCommand(CLI::App& app, Action* action);

// This machine as `devices` CPU devices (its cores split evenly; 0: one per core): the
// calibration file (`kc plan --calibrate`) when there is one for that many devices (a note
// says so when it was measured with another model than `model`), else a quick measurement
// through L1 (about a second) with the default cost-model constants. `source` says which.
struct LocalCluster {
  parallel::planner::PlannerCluster cluster;
  std::string source;
};
Result<LocalCluster> ProbeLocalCluster(int devices, const std::string& model,
                                       const std::string& calibration_path);

}  // namespace kc::app
