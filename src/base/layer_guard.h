// The runtime boundary monitor (ARCHITECTURE.md rules 3 and 5). A guard at each layer's
// public entry points keeps a thread-local stack of the layers executing. Entering a higher
// layer's entry point while a lower layer is on top (an upward call, e.g. through a
// callback), or a blocking entry point of another component of the same layer (a blocking
// call between peers), is a violation: counted, recorded with its stack trace, and handled
// at the level the policy gives it: info (log), warning (log + event to the owner topic),
// severe (the call is refused with kFailedPrecondition + alert event to the admin topic).
//
//   Status Communicator::Allreduce(...) {
//     KC_LAYER_ENTRY(Layer::kComm, "communicator");
//     ...
//   }
//   Status Detector::AwaitVerdict(...) {
//     KC_LAYER_BLOCKING_ENTRY(Layer::kFault, "detector", this);
//     ...
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/event_bus.h"
#include "base/layer.h"
#include "base/status.h"

namespace kc {

enum class ViolationKind : uint8_t {
  kUpwardCall = 0,        // a lower layer's code entered a higher layer's entry point
  kPeerBlockingCall = 1,  // a component blocked on another component of its own layer
};
std::string_view ViolationKindName(ViolationKind kind);  // "upward_call", ...

enum class AlertLevel : uint8_t { kInfo = 0, kWarning = 1, kSevere = 2 };
std::string_view AlertLevelName(AlertLevel level);  // "info", "warning", "severe"
std::optional<AlertLevel> AlertLevelFromName(std::string_view name);

// Which level each kind of violation is handled at.
struct MonitorPolicy {
  AlertLevel upward_call = AlertLevel::kSevere;
  AlertLevel peer_blocking_call = AlertLevel::kSevere;

  AlertLevel LevelFor(ViolationKind kind) const {
    return kind == ViolationKind::kUpwardCall ? upward_call : peer_blocking_call;
  }
  // Strict: every violation is refused and alerts the admin.
  static MonitorPolicy Development();
  // Quiet: upward calls notify the owner, peer blocking calls are only logged.
  static MonitorPolicy Production();
  // "development" or "production"; kInvalidArgument otherwise.
  static Result<MonitorPolicy> FromMode(std::string_view mode);
};

// One recorded violation.
struct Violation {
  ViolationKind kind;
  AlertLevel level;
  Layer caller_layer;  // the layer on top of the stack when the entry was called
  std::string caller_component;
  Layer callee_layer;  // the layer whose entry point was called
  std::string callee_component;
  std::string entry;        // the entry point's function name
  std::string layer_stack;  // "api/job_service > comm/transport", outermost first
  std::string stack_trace;  // symbolised, innermost first
  uint64_t count;           // violations of this kind and edge so far, this one included
};

// Events published for warning and severe violations. The owner topic is for the team that
// owns the offending (calling) layer; the admin topic is for the system administrator.
const Topic<Violation>& BoundaryOwnerTopic();  // "boundary.owner"
const Topic<Violation>& BoundaryAdminTopic();  // "boundary.admin"

// The process-wide monitor. Safe for concurrent use.
class BoundaryMonitor {
 public:
  static BoundaryMonitor& Global();

  void SetPolicy(const MonitorPolicy& policy);
  MonitorPolicy policy() const;

  // Warning and severe violations are published here. nullptr (the default) publishes
  // nothing. The bus is not owned and must outlive its use: clear it before destroying it.
  void SetEventBus(EventBus* bus);

  // Violations of `kind` since start or Reset().
  uint64_t count(ViolationKind kind) const;
  // The most recent violations (at most kMaxRecorded), oldest first.
  std::vector<Violation> recent() const;
  // Forgets counts and records (tests).
  void Reset();

  static constexpr size_t kMaxRecorded = 256;

  // Called by LayerScope on a violation. Returns the Status the entry point returns:
  // kFailedPrecondition for a severe violation, OK otherwise.
  Status Report(ViolationKind kind, Layer callee_layer, const char* callee_component,
                const char* entry);

 private:
  BoundaryMonitor() = default;
  struct State;
  State& state() const;
};

// The layer currently executing on this thread (top of the guard stack), if any.
std::optional<Layer> CurrentLayer();

// Whether an entry point may block its caller.
enum class EntryKind : uint8_t { kNonBlocking, kBlocking };

// Pushes (layer, component, instance) on the thread's guard stack for its lifetime, after
// checking the call against the frame on top. Cheap when nothing is violated (a few ns):
// no allocation, no lock, no atomic. Not movable; lives on the entry point's stack.
class LayerScope {
 public:
  LayerScope(Layer layer, const char* component, EntryKind kind, const void* instance,
             const char* entry) {
    Frame* const top = depth_ > 0 ? &stack_[Top()] : nullptr;
    if (top != nullptr &&
        (layer > top->layer || (kind == EntryKind::kBlocking && layer == top->layer &&
                                IsOtherComponent(*top, component, instance)))) {
      status_ = ReportViolation(layer, component, entry, top->layer);
      if (!status_.ok()) return;  // refused: not entered
    }
    if (depth_ < kMaxDepth) stack_[depth_] = Frame{layer, component, instance};
    ++depth_;
    entered_ = true;
  }
  ~LayerScope() {
    if (entered_) --depth_;
  }
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  static constexpr int kMaxDepth = 64;

 private:
  friend std::optional<Layer> CurrentLayer();
  friend class BoundaryMonitor;
  struct Frame {
    Layer layer;
    const char* component;
    const void* instance;
  };
  static int Top() { return (depth_ <= kMaxDepth ? depth_ : kMaxDepth) - 1; }
  static bool IsOtherComponent(const Frame& top, const char* component, const void* instance);
  static Status ReportViolation(Layer layer, const char* component, const char* entry,
                                Layer caller_layer);

  static constinit thread_local Frame stack_[kMaxDepth];
  static constinit thread_local int depth_;

  Status status_;
  bool entered_ = false;
};

}  // namespace kc

// Guards a non-blocking public entry point of `layer`. The enclosing function returns
// Status or Result<T>: a refused (severe) call returns kFailedPrecondition from it.
#define KC_LAYER_ENTRY(layer, component)                                                         \
  ::kc::LayerScope kc_layer_scope_((layer), (component), ::kc::EntryKind::kNonBlocking, nullptr, \
                                   __func__);                                                    \
  if (!kc_layer_scope_.ok()) [[unlikely]]                                                        \
  return kc_layer_scope_.status()

// Guards a blocking public entry point of the component instance `instance` (usually this).
// Use it for components that run concurrently with peers of their own layer and that peers
// must reach through queues (fault detectors, the scheduler's queue owner): a blocking call
// into one from another component of the layer is a violation. A library that components
// call as a dependency (a store client, a transport) uses KC_LAYER_ENTRY even where it
// blocks, since its callers are not its peers.
#define KC_LAYER_BLOCKING_ENTRY(layer, component, instance)                                      \
  ::kc::LayerScope kc_layer_scope_((layer), (component), ::kc::EntryKind::kBlocking, (instance), \
                                   __func__);                                                    \
  if (!kc_layer_scope_.ok()) [[unlikely]]                                                        \
  return kc_layer_scope_.status()
