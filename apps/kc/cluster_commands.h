// The commands that talk to kcd (docs/user-guide/jobs.md, docs/operations/agents.md):
// `kc login`, `kc submit`, `kc jobs`, `kc job show|logs|wait|cancel|pause|resume|modify`,
// `kc agent`, and `kc up` (kcd and one agent on this machine).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers the commands on `app`; when one is chosen, its action is stored in *action.
void AddClusterCommands(CLI::App& app, Action* action);

}  // namespace kc::app
