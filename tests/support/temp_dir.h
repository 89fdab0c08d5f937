// Test support: a fresh directory under the test temp dir, removed with everything in it when
// the object goes. Header-only.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kc::testing {

class TempDir {
 public:
  // `prefix` names the test, so a leftover directory says whose it is.
  explicit TempDir(const std::string& prefix = "kc_test") {
    static int n = 0;
    path_ =
        ::testing::TempDir() + prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(n++);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `bytes` to `name` inside the directory (creating subdirectories); returns its path.
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path p = std::filesystem::path(path_) / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string Path(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kc::testing
