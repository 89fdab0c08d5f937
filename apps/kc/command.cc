#include "apps/kc/command.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/file.h"

namespace kc::app {

Status ParseHostPort(const std::string& s, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgumentError("--store: \"" + s + "\" is not HOST:PORT");
  }
  *host = s.substr(0, colon);
  const std::string p = s.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), *port);
  if (ec != std::errc() || ptr != p.data() + p.size() || *port < 0 || *port > 65535) {
    return InvalidArgumentError("--store: bad port in \"" + s + "\"");
  }
  return OkStatus();
}

std::string UserConfigPath(const std::string& file) {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/kc/" + file;
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.config/kc/" + file;
  }
  return file;
}

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  return WriteFileDurably(path, text);
}

}  // namespace kc::app
