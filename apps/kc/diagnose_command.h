// `kc diagnose RUN`: a run's troubles found bottom-up, L1 to L4, with evidence and fixes.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `diagnose` on `app`; when chosen, its action is stored in *action.
void AddDiagnoseCommand(CLI::App& app, Action* action);

}  // namespace kc::app
