#include "base/stacktrace.h"

#include <cxxabi.h>
#include <execinfo.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace kc {
namespace {

// backtrace_symbols gives "binary(mangled+0x1c) [0x...]"; print the demangled name.
std::string DescribeFrame(const char* raw) {
  const char* open = std::strchr(raw, '(');
  const char* plus = open ? std::strchr(open, '+') : nullptr;
  if (open == nullptr || plus == nullptr || plus == open + 1) return raw;
  std::string mangled(open + 1, plus);
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  const char* close = std::strchr(plus, ')');
  std::string offset = close ? std::string(plus, close) : std::string(plus);
  return (status == 0 && demangled ? std::string(demangled.get()) : mangled) + " " + offset;
}

}  // namespace

std::string CurrentStackTrace(int skip, int max_frames) {
  constexpr int kLimit = 64;
  void* frames[kLimit];
  const int want = std::min(kLimit, max_frames + skip + 1);
  const int n = backtrace(frames, want);
  std::unique_ptr<char*, void (*)(void*)> symbols(backtrace_symbols(frames, n), std::free);
  std::string out;
  for (int i = skip + 1; i < n; ++i) {
    out += "  #" + std::to_string(i - skip - 1) + " ";
    out += symbols ? DescribeFrame(symbols.get()[i]) : std::string("?");
    out += '\n';
  }
  return out;
}

}  // namespace kc
