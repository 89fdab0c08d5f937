// What every `kc` subcommand shares: how it is run and its exit codes.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"

namespace kc::app {

// Exit codes of every kc command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the command ran and failed
inline constexpr int kExitBadInput = 2;  // bad arguments or configuration; nothing was done
// `kc plan --approval-limits`: the chosen plan is past a limit and needs a resource admin's
// approval; it was reported, not written.
inline constexpr int kExitNeedsApproval = 3;

// A parsed subcommand, run after the global settings are loaded. Returns the exit code.
using Action = std::function<int()>;

// A flag's seconds as the clocks' Duration.
Duration SecondsToDuration(double seconds);

// Splits the value of --store, "HOST:PORT" (port 0-65535), for the workers a launcher starts.
Status ParseHostPort(const std::string& s, std::string* host, int* port);

// `file` in kc's per-user configuration directory: $XDG_CONFIG_HOME/kc/, else ~/.config/kc/,
// else the working directory. Where `kc topo probe` writes topology.yaml and
// `kc plan --calibrate` calibration.json.
std::string UserConfigPath(const std::string& file);

// `text` safe to show on a terminal: control characters (C0, DEL, C1: ESC sequences, carriage
// returns, newlines that would forge another line) and bytes that are not UTF-8 are written as
// escapes (\n, \x1b, \u{9b}). What kcd stores came from users and jobs: kc prints it through
// this wherever it prints it as text.
std::string Printable(std::string_view text);

// Writes `text` to `path` through a temporary file and a rename, creating the parent
// directories; kUnavailable naming the file when that fails.
Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace kc::app
