// Process settings every Kuangchao binary reads at start-up: logging and the boundary
// monitor's levels. Loaded strictly from a YAML file (docs/user-guide/configuration.md).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/layer_guard.h"
#include "base/log.h"
#include "base/status.h"

namespace kc {

struct Settings {
  log::Severity log_level = log::Severity::kInfo;
  int log_verbosity = 0;
  std::string log_file;  // "" = stderr
  std::string boundary_mode = "development";
  MonitorPolicy boundary = MonitorPolicy::Development();
};

// Reads settings from `path`. Unknown keys, wrong types and out-of-range values are
// kInvalidArgument with "FILE:LINE: key.path: ..." messages; a missing file is kNotFound.
Result<Settings> LoadSettings(const std::string& path);
// As LoadSettings, for YAML text in memory; `display_name` stands for the file in errors.
Result<Settings> LoadSettingsString(std::string_view text, std::string display_name);

// Applies settings to this process: log level, verbosity and sink; the boundary policy.
// kInvalidArgument if the log file cannot be opened (nothing is changed then).
Status ApplySettings(const Settings& settings);

// The settings as the YAML a user would write to get them.
std::string SettingsToYaml(const Settings& settings);

}  // namespace kc
