// A source position captured at the call site. std::source_location is not usable with
// clang 14 and libstdc++, so this uses the builtins both compilers share.
#pragma once

#include <cstdint>

namespace kc {

struct SourceLocation {
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE()) {
    return SourceLocation{file, line};
  }
  const char* file = "";
  int line = 0;
};

}  // namespace kc
