// Test support: the repository root, found from this header's own path, so tests can read
// the shipped examples without a compile definition. Header-only.
#pragma once

#include <string>
#include <string_view>

namespace kc::testing {

// The repository root with a trailing '/'.
inline std::string RepoRoot() {
  const std::string_view file = __FILE__;
  constexpr std::string_view kTail = "tests/support/repo_root.h";
  return std::string(file.substr(0, file.size() - kTail.size()));
}

}  // namespace kc::testing
