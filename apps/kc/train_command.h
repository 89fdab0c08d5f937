// `kc train CONFIG`: train a model on this machine (docs/user-guide/train.md).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `train` on `app`; when chosen, its action is stored in *action.
void AddTrainCommand(CLI::App& app, Action* action);

}  // namespace kc::app
