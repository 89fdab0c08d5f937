#include "apps/kc/command.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/file.h"

namespace kc::app {

Duration SecondsToDuration(double seconds) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}

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

std::string Printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    switch (c) {
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      default:
        break;
    }
    // A whole UTF-8 sequence passes, but for the C1 controls (U+0080 to U+009F).
    const size_t n = c >= 0xf0 && c < 0xf5   ? 4
                     : c >= 0xe0 && c < 0xf0 ? 3
                     : c >= 0xc2 && c < 0xe0 ? 2
                                             : 0;
    bool whole = n > 0 && i + n <= text.size();
    for (size_t k = 1; whole && k < n; ++k) {
      whole = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    }
    if (whole && !(n == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0)) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    if (whole) {  // a C1 control
      out += fmt::format("\\u{{{:x}}}", static_cast<unsigned char>(text[i + 1]));
      i += 2;
      continue;
    }
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 0xf];
    ++i;
  }
  return out;
}

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  return WriteFileDurably(path, text);
}

}  // namespace kc::app
