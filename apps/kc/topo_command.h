// `kc topo ...`: probe and report this host's topology.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `topo` and its subcommands on `app`; the chosen one is stored in *action.
void AddTopoCommand(CLI::App& app, Action* action);

}  // namespace kc::app
