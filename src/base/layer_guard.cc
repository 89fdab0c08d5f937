// The runtime boundary monitor: violation counting, recording and the three alert levels.
#include "base/layer_guard.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <tuple>

#include "base/log.h"
#include "base/stacktrace.h"

namespace kc {

constinit thread_local LayerScope::Frame LayerScope::stack_[LayerScope::kMaxDepth] = {};
constinit thread_local int LayerScope::depth_ = 0;

std::string_view ViolationKindName(ViolationKind kind) {
  return kind == ViolationKind::kUpwardCall ? "upward_call" : "peer_blocking_call";
}

std::string_view AlertLevelName(AlertLevel level) {
  switch (level) {
    case AlertLevel::kInfo:
      return "info";
    case AlertLevel::kWarning:
      return "warning";
    case AlertLevel::kSevere:
      return "severe";
  }
  return "info";
}

std::optional<AlertLevel> AlertLevelFromName(std::string_view name) {
  for (AlertLevel l : {AlertLevel::kInfo, AlertLevel::kWarning, AlertLevel::kSevere}) {
    if (AlertLevelName(l) == name) return l;
  }
  return std::nullopt;
}

MonitorPolicy MonitorPolicy::Development() {
  return {.upward_call = AlertLevel::kSevere, .peer_blocking_call = AlertLevel::kSevere};
}

MonitorPolicy MonitorPolicy::Production() {
  return {.upward_call = AlertLevel::kWarning, .peer_blocking_call = AlertLevel::kInfo};
}

Result<MonitorPolicy> MonitorPolicy::FromMode(std::string_view mode) {
  if (mode == "development") return Development();
  if (mode == "production") return Production();
  return InvalidArgumentError(
      "boundary monitor mode must be \"development\" or \"production\", "
      "got \"" +
      std::string(mode) + "\"");
}

const Topic<Violation>& BoundaryOwnerTopic() {
  static const Topic<Violation>* const topic = new Topic<Violation>("boundary.owner");
  return *topic;
}

const Topic<Violation>& BoundaryAdminTopic() {
  static const Topic<Violation>* const topic = new Topic<Violation>("boundary.admin");
  return *topic;
}

std::optional<Layer> CurrentLayer() {
  if (LayerScope::depth_ == 0) return std::nullopt;
  return LayerScope::stack_[LayerScope::Top()].layer;
}

bool LayerScope::IsOtherComponent(const Frame& top, const char* component, const void* instance) {
  if (top.instance != instance) return true;
  if (top.component == component) return false;
  return std::strcmp(top.component, component) != 0;
}

Status LayerScope::ReportViolation(Layer layer, const char* component, const char* entry,
                                   Layer caller_layer) {
  const ViolationKind kind =
      layer > caller_layer ? ViolationKind::kUpwardCall : ViolationKind::kPeerBlockingCall;
  return BoundaryMonitor::Global().Report(kind, layer, component, entry);
}

struct BoundaryMonitor::State {
  // (kind, caller layer, caller component, callee layer, callee component, entry)
  using Edge = std::tuple<int, int, std::string, int, std::string, std::string>;

  mutable Mutex mu;
  MonitorPolicy policy KC_GUARDED_BY(mu) = MonitorPolicy::Development();
  EventBus* bus KC_GUARDED_BY(mu) = nullptr;
  std::array<uint64_t, 2> counts KC_GUARDED_BY(mu) = {0, 0};
  std::map<Edge, uint64_t> edge_counts KC_GUARDED_BY(mu);
  std::deque<Violation> recent KC_GUARDED_BY(mu);
};

BoundaryMonitor& BoundaryMonitor::Global() {
  static BoundaryMonitor* const monitor = new BoundaryMonitor();
  return *monitor;
}

BoundaryMonitor::State& BoundaryMonitor::state() const {
  static State* const s = new State();
  return *s;
}

void BoundaryMonitor::SetPolicy(const MonitorPolicy& policy) {
  MutexLock lock(&state().mu);
  state().policy = policy;
}

MonitorPolicy BoundaryMonitor::policy() const {
  MutexLock lock(&state().mu);
  return state().policy;
}

void BoundaryMonitor::SetEventBus(EventBus* bus) {
  MutexLock lock(&state().mu);
  state().bus = bus;
}

uint64_t BoundaryMonitor::count(ViolationKind kind) const {
  MutexLock lock(&state().mu);
  return state().counts[static_cast<int>(kind)];
}

std::vector<Violation> BoundaryMonitor::recent() const {
  MutexLock lock(&state().mu);
  return {state().recent.begin(), state().recent.end()};
}

void BoundaryMonitor::Reset() {
  MutexLock lock(&state().mu);
  state().counts = {0, 0};
  state().edge_counts.clear();
  state().recent.clear();
}

Status BoundaryMonitor::Report(ViolationKind kind, Layer callee_layer, const char* callee_component,
                               const char* entry) {
  // Describe the thread's guard stack, outermost first.
  const int depth = std::min(LayerScope::depth_, LayerScope::kMaxDepth);
  const LayerScope::Frame& top = LayerScope::stack_[depth - 1];
  std::string layer_stack;
  for (int i = 0; i < depth; ++i) {
    if (i > 0) layer_stack += " > ";
    layer_stack +=
        std::string(LayerName(LayerScope::stack_[i].layer)) + "/" + LayerScope::stack_[i].component;
  }
  layer_stack += std::string(" > ") + std::string(LayerName(callee_layer)) + "/" + callee_component;

  Violation v{.kind = kind,
              .level = AlertLevel::kInfo,
              .caller_layer = top.layer,
              .caller_component = top.component,
              .callee_layer = callee_layer,
              .callee_component = callee_component,
              .entry = entry,
              .layer_stack = std::move(layer_stack),
              .stack_trace = CurrentStackTrace(/*skip=*/2),
              .count = 0};

  EventBus* bus;
  {
    State& s = state();
    MutexLock lock(&s.mu);
    v.level = s.policy.LevelFor(kind);
    ++s.counts[static_cast<int>(kind)];
    v.count = ++s.edge_counts[State::Edge{static_cast<int>(kind), static_cast<int>(v.caller_layer),
                                          v.caller_component, static_cast<int>(callee_layer),
                                          v.callee_component, v.entry}];
    s.recent.push_back(v);
    if (s.recent.size() > kMaxRecorded) s.recent.pop_front();
    bus = s.bus;
  }

  // Log every violation's first occurrence on its edge with the stack, then every 1000th.
  const bool with_stack = v.count == 1 || v.count % 1000 == 0;
  const log::Severity severity = v.level == AlertLevel::kSevere    ? log::Severity::kError
                                 : v.level == AlertLevel::kWarning ? log::Severity::kWarning
                                                                   : log::Severity::kInfo;
  if (with_stack || v.level == AlertLevel::kSevere) {
    log::internal::Emit(
        severity, __FILE__, __LINE__,
        fmt::format("boundary violation kind={} level={} caller={}/{} callee={}/{} entry={} "
                    "count={} stack=\"{}\"{}",
                    ViolationKindName(kind), AlertLevelName(v.level), LayerName(v.caller_layer),
                    v.caller_component, LayerName(callee_layer), v.callee_component, v.entry,
                    v.count, v.layer_stack, with_stack ? "\n" + v.stack_trace : ""));
  }

  // Published outside the monitor's lock: subscribers may call back into the monitor.
  if (bus != nullptr && v.level != AlertLevel::kInfo) {
    const Topic<Violation>& topic =
        v.level == AlertLevel::kSevere ? BoundaryAdminTopic() : BoundaryOwnerTopic();
    Status published = bus->Publish(topic, v);
    if (!published.ok()) {
      KC_LOG(WARNING) << "boundary alert not published " << log::KV("status", published);
    }
  }

  if (v.level == AlertLevel::kSevere) {
    return FailedPreconditionError(
        fmt::format("boundary violation refused: {} from {}/{} into {}/{} ({}); stack: {}",
                    ViolationKindName(kind), LayerName(v.caller_layer), v.caller_component,
                    LayerName(callee_layer), v.callee_component, v.entry, v.layer_stack));
  }
  return OkStatus();
}

}  // namespace kc
