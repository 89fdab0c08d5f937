// The commands for kcd's admin services (docs/user-guide/kc.md): `kc quota
// show|request|requests|approve|deny`, `kc pools [put FILE]` and
// `kc cluster topology [put FILE]`. `kc audit query` is with the other `kc audit` forms.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/kc/command.h"

namespace kc::app {

// Registers the commands on `app`; when one is chosen, its action is stored in *action.
void AddAdminCommands(CLI::App& app, Action* action);

}  // namespace kc::app
