#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `bench` and its subcommands (`bench comm`) on `app`; the chosen one is stored in
// *action.
void AddBenchCommand(CLI::App& app, Action* action);

}  // namespace kc::app
