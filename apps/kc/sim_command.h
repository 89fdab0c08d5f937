// `kc sim`: replays a job trace through the scheduler on virtual time, side by side with the
// FIFO baseline, and `kc sim generate`: synthetic traces (docs/operations/scheduling.md).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `sim` and `sim generate` on `app`; when chosen, the action is stored in *action.
void AddSimCommand(CLI::App& app, Action* action);

}  // namespace kc::app
