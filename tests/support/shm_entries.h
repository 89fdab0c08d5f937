// Test support: count /dev/shm entries, to check that shared-memory segments are gone.
// Header-only.
#pragma once

#include <dirent.h>

#include <string>
#include <string_view>

namespace kc::testing {

// Entries of /dev/shm whose name starts with `prefix` (no leading '/').
inline int CountShmEntries(std::string_view prefix) {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (std::string_view(e->d_name).starts_with(prefix)) ++n;
  }
  closedir(d);
  return n;
}

}  // namespace kc::testing
