// Writing YAML scalars for the files hal writes (inventories, grouping files).
#pragma once

#include <string>
#include <string_view>

namespace kc::hal::internal {

// `s` as a YAML scalar: plain when that reads back as the same string (letters, digits,
// '.', '_', '-', '/', not starting with punctuation, not a null word), else double-quoted
// with '"', '\' and control characters escaped.
std::string YamlString(std::string_view s);

}  // namespace kc::hal::internal
