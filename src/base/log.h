// The one logging facility (STYLE.md §8): KC_LOG(INFO) << "peer timeout " << KV("peer", 3);
// Every line is prefixed with rank/world size, step and the executing layer.
#pragma once

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

namespace kc::log {

enum class Severity { kInfo, kWarning, kError, kFatal };

// Process-wide log context. Workers set rank and world size once at start-up and the step
// as training advances; lines before that show "-". Safe for concurrent use.
void SetRank(int rank, int world_size);
void SetStep(int64_t step);
void ClearContext();

// Lines below `level` are dropped (default kInfo).
void SetMinSeverity(Severity level);
Severity MinSeverity();

// KC_VLOG(n) prints when n <= verbosity (default 0: off). Cheap when off: one relaxed load.
void SetVerbosity(int level);
inline std::atomic<int> g_verbosity{0};
inline bool VlogIsOn(int n) { return n <= g_verbosity.load(std::memory_order_relaxed); }

// Sends log lines to `path` (appending) instead of stderr; "" restores stderr.
// Returns false, leaving the sink unchanged, if the file cannot be opened.
bool SetLogFile(const std::string& path);

// Captures every line formatted from now on (for tests); returns them on StopCapture.
void StartCapture();
std::string StopCapture();

// A key=value field for event lines: KV("peer", 3) prints peer=3; strings containing spaces,
// quotes or '=' are quoted.
template <typename T>
struct KeyValue {
  std::string_view key;
  const T& value;
};
template <typename T>
KeyValue<T> KV(std::string_view key, const T& value) {
  return {key, value};
}
std::string QuoteIfNeeded(std::string_view s);
template <typename T>
std::ostream& operator<<(std::ostream& os, const KeyValue<T>& kv) {
  std::ostringstream v;
  v << kv.value;
  return os << kv.key << '=' << QuoteIfNeeded(v.str());
}

namespace internal {

// Formats one line; emits it from the destructor. kFatal aborts after emitting.
class LogMessage {
 public:
  LogMessage(Severity severity, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  Severity severity_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Writes an already formatted line (used by CHECK failures).
void Emit(Severity severity, const char* file, int line, std::string_view text);

}  // namespace internal
}  // namespace kc::log

#define KC_LOG_SEVERITY_INFO ::kc::log::Severity::kInfo
#define KC_LOG_SEVERITY_WARNING ::kc::log::Severity::kWarning
#define KC_LOG_SEVERITY_ERROR ::kc::log::Severity::kError
#define KC_LOG_SEVERITY_FATAL ::kc::log::Severity::kFatal

// KC_LOG(INFO|WARNING|ERROR|FATAL) << ...;
#define KC_LOG(severity) \
  ::kc::log::internal::LogMessage(KC_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()

// Debug detail, off by default: KC_VLOG(2) << ...;
#define KC_VLOG(n)                 \
  switch (0)                       \
  case 0:                          \
  default:                         \
    if (!::kc::log::VlogIsOn(n)) { \
    } else                         \
      KC_LOG(INFO)
