// `kc init DIR`: a new cluster's control-plane directory (docs/operations/cluster.md).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `init` on `app`; when chosen, its action is stored in *action.
void AddInitCommand(CLI::App& app, Action* action);

}  // namespace kc::app
