// `kc plan`: the planner for people and tools.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `plan` on `app`; the parsed command is stored in *action.
void AddPlanCommand(CLI::App& app, Action* action);

}  // namespace kc::app
