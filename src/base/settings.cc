#include "base/settings.h"

#include <fmt/format.h>

#include "base/config.h"

namespace kc {
namespace {

log::Severity SeverityFromName(const std::string& name) {
  if (name == "warning") return log::Severity::kWarning;
  if (name == "error") return log::Severity::kError;
  return log::Severity::kInfo;
}

std::string_view SeverityName(log::Severity s) {
  switch (s) {
    case log::Severity::kWarning:
      return "warning";
    case log::Severity::kError:
      return "error";
    default:
      return "info";
  }
}

}  // namespace

namespace {

Result<Settings> ReadSettings(config::Document doc) {
  Settings s;
  config::Map root = doc.root();
  config::Map logging = root.OptionalMap("log");
  s.log_level =
      SeverityFromName(logging.OptionalChoice("level", "info", {"info", "warning", "error"}));
  s.log_verbosity = static_cast<int>(logging.OptionalInt("verbosity", 0, config::InRange(0, 9)));
  s.log_file = logging.OptionalString("file", "");

  config::Map boundary = root.OptionalMap("boundary");
  s.boundary_mode = boundary.OptionalChoice("mode", "development", {"development", "production"});
  s.boundary = *MonitorPolicy::FromMode(s.boundary_mode);
  const auto level = [&](std::string_view key, AlertLevel fallback) {
    return *AlertLevelFromName(
        boundary.OptionalChoice(key, AlertLevelName(fallback), {"info", "warning", "severe"}));
  };
  s.boundary.upward_call = level("upward_call", s.boundary.upward_call);
  s.boundary.peer_blocking_call = level("peer_blocking_call", s.boundary.peer_blocking_call);
  KC_RETURN_IF_ERROR(doc.Finish());
  return s;
}

}  // namespace

Result<Settings> LoadSettings(const std::string& path) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ReadSettings(std::move(doc));
}

Result<Settings> LoadSettingsString(std::string_view text, std::string display_name) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ReadSettings(std::move(doc));
}

Status ApplySettings(const Settings& settings) {
  if (!log::SetLogFile(settings.log_file)) {
    return InvalidArgumentError("log.file: cannot open \"" + settings.log_file +
                                "\" for appending");
  }
  log::SetMinSeverity(settings.log_level);
  log::SetVerbosity(settings.log_verbosity);
  BoundaryMonitor::Global().SetPolicy(settings.boundary);
  return OkStatus();
}

std::string SettingsToYaml(const Settings& s) {
  return fmt::format(
      "log:\n  level: {}\n  verbosity: {}\n  file: \"{}\"\n"
      "boundary:\n  mode: {}\n  upward_call: {}\n  peer_blocking_call: {}\n",
      SeverityName(s.log_level), s.log_verbosity, s.log_file, s.boundary_mode,
      AlertLevelName(s.boundary.upward_call), AlertLevelName(s.boundary.peer_blocking_call));
}

}  // namespace kc
