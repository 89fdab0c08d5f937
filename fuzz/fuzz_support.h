// What the fuzz targets share: the input as text, and a scratch directory of the process's own
// for targets whose code under test reads files. Header-only.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace kc::fuzz {

inline std::string_view Text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A directory that lives as long as the process (removed when it exits normally).
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string templ = (std::filesystem::temp_directory_path() / "kc_fuzz_XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) abort();
    static std::string removed = templ;
    atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(removed, ec);
    });
    return templ;
  }();
  return dir;
}

// Writes `bytes` to `name` in the scratch directory; returns its path.
inline std::string WriteScratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path p = std::filesystem::path(ScratchDir()) / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p.string();
}

}  // namespace kc::fuzz
