// Test support: run the kc binary and collect its stdout, stderr and exit code. Header-only.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace kc::testing {

struct KcRun {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `binary` with `args` (a shell word list). Stderr goes through a file of its own per
// process and call: ctest runs test processes side by side.
inline KcRun RunKc(const std::string& binary, const std::string& args) {
  static int calls = 0;
  const std::string err_path = ::testing::TempDir() + "kc_stderr_" + std::to_string(getpid()) +
                               "_" + std::to_string(calls++) + ".txt";
  const std::string cmd = binary + " " + args + " 2>" + err_path;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {-1, "", "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  std::ifstream e(err_path);
  std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  std::remove(err_path.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, err};
}

}  // namespace kc::testing
