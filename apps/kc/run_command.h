// `kc run --nproc N -- PROGRAM ARGS...`: any program as N local ranks (or across hosts:
// run_hosts.h) with torchrun's launch environment, restarts by policy, and each rank's output
// prefixed by its rank.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `run` on `app`; when chosen, its action is stored in *action.
void AddRunCommand(CLI::App& app, Action* action);

}  // namespace kc::app
