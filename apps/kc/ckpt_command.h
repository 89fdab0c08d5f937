// `kc ckpt ls|verify|inspect`: checkpoints for people (docs/user-guide/checkpoints.md).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `ckpt` and its subcommands on `app`; when one is chosen, its action is stored in
// *action.
void AddCkptCommand(CLI::App& app, Action* action);

}  // namespace kc::app
