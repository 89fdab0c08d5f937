// Test support: the repository root, found from this header's own path, so tests can read
// the shipped examples without a compile definition. Header-only.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace kc::testing {

// The repository root with a trailing '/'.
inline std::string RepoRoot() {
  const std::string_view file = __FILE__;
  constexpr std::string_view kTail = "tests/support/repo_root.h";
  const std::string root(file.substr(0, file.size() - kTail.size()));
  if (root.starts_with('/')) return root;
  // A relative __FILE__ is relative to where the compiler ran (ccache's base_dir rewrites
  // paths so): the build directory, an ancestor of where the test runs. Find it upwards.
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path dir = fs::current_path(ec); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / file, ec)) {
      const std::string found = fs::weakly_canonical(dir / file, ec).string();
      return found.substr(0, found.size() - kTail.size());
    }
    if (dir == dir.parent_path()) break;
  }
  return root;
}

}  // namespace kc::testing
