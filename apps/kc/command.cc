#include "apps/kc/command.h"

#include <charconv>

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

}  // namespace kc::app
