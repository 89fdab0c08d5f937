#include "hal/internal/yaml_text.h"

#include <algorithm>

namespace kc::hal::internal {
namespace {

bool IsPlainChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/';
}

}  // namespace

std::string YamlString(std::string_view s) {
  const bool plain = !s.empty() && s != "null" && s != "Null" && s != "NULL" && s != "~" &&
                     IsPlainChar(s[0]) && s[0] != '.' && s[0] != '_' && s[0] != '-' &&
                     s[0] != '/' && std::all_of(s.begin(), s.end(), IsPlainChar);
  if (plain) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[(c >> 4) & 0xF];
      out += kHex[c & 0xF];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace kc::hal::internal
