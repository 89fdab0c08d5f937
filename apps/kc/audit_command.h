// `kc audit verify|show|query`: check and read an audit log, a file or kcd's
// (docs/operations/roles.md).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers `audit` and its subcommands on `app`; when one is chosen, its action is stored in
// *action.
void AddAuditCommand(CLI::App& app, Action* action);

}  // namespace kc::app
