// `kc data ...`: turn text into token shards for training.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `data` and its subcommands on `app`; the chosen one is stored in *action.
void AddDataCommand(CLI::App& app, Action* action);

}  // namespace kc::app
