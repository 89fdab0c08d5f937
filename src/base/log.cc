// Logging through spdlog with the rank/step/layer prefix.
#include "base/log.h"

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/layer_guard.h"
#include "base/mutex.h"

namespace kc::log {
namespace {

std::atomic<int> g_rank{-1};
std::atomic<int> g_world_size{-1};
std::atomic<int64_t> g_step{-1};
std::atomic<int> g_min_severity{static_cast<int>(Severity::kInfo)};

struct Sinks {
  Mutex mu;
  std::shared_ptr<spdlog::logger> logger KC_GUARDED_BY(mu);
  std::ostringstream capture KC_GUARDED_BY(mu);
  bool capturing KC_GUARDED_BY(mu) = false;
};

Sinks& GetSinks() {
  static Sinks* const sinks = [] {
    auto* s = new Sinks();
    MutexLock lock(&s->mu);
    s->logger =
        std::make_shared<spdlog::logger>("kc", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    s->logger->set_pattern("%L%m%d %H:%M:%S.%f %v");
    s->logger->set_level(spdlog::level::trace);
    return s;
  }();
  return *sinks;
}

spdlog::level::level_enum ToSpd(Severity s) {
  switch (s) {
    case Severity::kInfo:
      return spdlog::level::info;
    case Severity::kWarning:
      return spdlog::level::warn;
    case Severity::kError:
      return spdlog::level::err;
    case Severity::kFatal:
      return spdlog::level::critical;
  }
  return spdlog::level::info;
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetRank(int rank, int world_size) {
  g_rank.store(rank);
  g_world_size.store(world_size);
}
void SetStep(int64_t step) { g_step.store(step); }
void ClearContext() {
  g_rank.store(-1);
  g_world_size.store(-1);
  g_step.store(-1);
}
void SetMinSeverity(Severity level) { g_min_severity.store(static_cast<int>(level)); }
Severity MinSeverity() { return static_cast<Severity>(g_min_severity.load()); }
void SetVerbosity(int level) { g_verbosity.store(level); }

bool SetLogFile(const std::string& path) {
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (path.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  } else {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
    } catch (const spdlog::spdlog_ex&) {
      return false;
    }
  }
  auto logger = std::make_shared<spdlog::logger>("kc", std::move(sink));
  logger->set_pattern("%L%m%d %H:%M:%S.%f %v");
  logger->set_level(spdlog::level::trace);
  Sinks& s = GetSinks();
  MutexLock lock(&s.mu);
  s.logger = std::move(logger);
  return true;
}

void StartCapture() {
  Sinks& s = GetSinks();
  MutexLock lock(&s.mu);
  s.capture.str("");
  s.capturing = true;
}

std::string StopCapture() {
  Sinks& s = GetSinks();
  MutexLock lock(&s.mu);
  s.capturing = false;
  return s.capture.str();
}

std::string QuoteIfNeeded(std::string_view s) {
  if (!s.empty() && s.find_first_of(" \t\n\"=") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

namespace internal {

void Emit(Severity severity, const char* file, int line, std::string_view text) {
  if (static_cast<int>(severity) < g_min_severity.load(std::memory_order_relaxed) &&
      severity != Severity::kFatal) {
    return;
  }
  const int rank = g_rank.load(std::memory_order_relaxed);
  const int world = g_world_size.load(std::memory_order_relaxed);
  const int64_t step = g_step.load(std::memory_order_relaxed);
  const std::optional<Layer> layer = CurrentLayer();
  const std::string prefix = fmt::format(
      "{}/{} step={} layer={} {}:{}]", rank < 0 ? std::string("-") : std::to_string(rank),
      world < 0 ? std::string("-") : std::to_string(world),
      step < 0 ? std::string("-") : std::to_string(step),
      layer ? LayerName(*layer) : std::string_view("-"), Basename(file), line);
  Sinks& s = GetSinks();
  MutexLock lock(&s.mu);
  s.logger->log(ToSpd(severity), "{} {}", prefix, text);
  if (severity >= Severity::kWarning) s.logger->flush();
  if (s.capturing) s.capture << prefix << ' ' << text << '\n';
}

LogMessage::LogMessage(Severity severity, const char* file, int line)
    : severity_(severity), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  Emit(severity_, file_, line_, stream_.str());
  if (severity_ == Severity::kFatal) std::abort();
}

}  // namespace internal
}  // namespace kc::log
