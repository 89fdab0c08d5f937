// The in-process event bus: how a lower layer tells an upper layer something (ARCHITECTURE.md
// rule 2). Topics are typed; delivery is asynchronous, on the bus's own thread, through a
// bounded queue whose overflow policy is chosen per bus.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <typeindex>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"

namespace kc {

// A named channel carrying events of type T. Cheap value; define topics as constants next to
// their event type, e.g. `inline const Topic<FaultEvent> kFaultTopic{"fault.events"};`.
template <typename T>
class Topic {
 public:
  explicit Topic(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// What Publish does when the queue already holds `queue_capacity` events.
enum class OverflowPolicy {
  // Drop the oldest queued event and accept the new one; Publish returns OK. For telemetry,
  // where the newest state matters most. Drops are counted in Stats::dropped.
  kDropOldest,
  // Refuse the new event: Publish returns kResourceExhausted. Drops are counted.
  kRejectNew,
  // Block the publisher until there is room or `publish_timeout` passes
  // (kDeadlineExceeded). A publish from a subscriber callback never blocks: it returns
  // kResourceExhausted instead, since the queue cannot drain while the callback runs.
  kBlock,
};

struct EventBusOptions {
  std::string name = "events";
  size_t queue_capacity = 4096;
  OverflowPolicy overflow = OverflowPolicy::kDropOldest;
  Duration publish_timeout = std::chrono::seconds(1);
  Clock* clock = Clock::Real();  // not owned; must outlive the bus
};

class EventBus;

// Keeps a subscription alive; unsubscribes when destroyed. Movable, not copyable.
class Subscription {
 public:
  Subscription() = default;
  Subscription(Subscription&& other) noexcept;
  Subscription& operator=(Subscription&& other) noexcept;
  ~Subscription();
  // After Cancel returns, the callback is not running and will not run again (unless Cancel
  // is called from inside the callback itself, which then finishes normally).
  void Cancel();
  bool active() const { return bus_ != nullptr; }

 private:
  friend class EventBus;
  Subscription(EventBus* bus, uint64_t id) : bus_(bus), id_(id) {}
  EventBus* bus_ = nullptr;  // not owned; the bus outlives its subscriptions
  uint64_t id_ = 0;
};

// Delivers published events to the topic's subscribers, in publish order, on one dispatcher
// thread. A slow subscriber delays the others on the same bus: keep callbacks short or hand
// work to a queue of your own. Safe for concurrent use.
class EventBus {
 public:
  struct Stats {
    uint64_t published = 0;  // accepted into the queue
    uint64_t delivered = 0;  // events taken off the queue and handed to subscribers
    uint64_t dropped = 0;    // lost to the overflow policy
    size_t queue_high_water = 0;
  };

  explicit EventBus(EventBusOptions options = {});
  // Delivers what is queued, then stops the dispatcher thread.
  // REQUIRES: every Subscription to this bus has been destroyed or cancelled.
  ~EventBus();
  EventBus(const EventBus&) = delete;
  EventBus& operator=(const EventBus&) = delete;

  // Calls `fn` on the dispatcher thread for every later event on `topic`.
  // kInvalidArgument if the topic name is already used with another event type.
  template <typename T>
  Result<Subscription> Subscribe(const Topic<T>& topic, std::function<void(const T&)> fn) {
    auto handler = [fn = std::move(fn)](const void* event) { fn(*static_cast<const T*>(event)); };
    return SubscribeErased(topic.name(), std::type_index(typeid(T)), std::move(handler));
  }

  // Queues `event` for delivery and returns at once (subject to the overflow policy).
  // kInvalidArgument if the topic name is used with another type; kResourceExhausted or
  // kDeadlineExceeded from the overflow policy; kCancelled once the bus is shutting down.
  template <typename T>
  Status Publish(const Topic<T>& topic, T event) {
    return PublishErased(topic.name(), std::type_index(typeid(T)),
                         std::make_shared<const T>(std::move(event)));
  }

  // Blocks until every event accepted before the call has been delivered, or until
  // `deadline` (kDeadlineExceeded). From a subscriber callback: kFailedPrecondition.
  Status Flush(TimePoint deadline);
  // Flush with a deadline `timeout` from now on the bus's clock.
  Status Flush(Duration timeout = std::chrono::seconds(10));

  Stats stats() const;
  const EventBusOptions& options() const { return options_; }

 private:
  friend class Subscription;
  using ErasedHandler = std::function<void(const void*)>;
  struct Envelope {
    std::string topic;
    std::shared_ptr<const void> event;
    uint64_t seq;
  };
  struct Handler {
    uint64_t id;
    std::string topic;
    ErasedHandler fn;
  };

  Result<Subscription> SubscribeErased(const std::string& topic, std::type_index type,
                                       ErasedHandler fn);
  Status PublishErased(const std::string& topic, std::type_index type,
                       std::shared_ptr<const void> event);
  Status CheckType(const std::string& topic, std::type_index type) KC_REQUIRES(mu_);
  void Unsubscribe(uint64_t id);
  void Run();
  bool OnDispatcherThread() const;
  // The lowest seq not yet done (delivered or dropped).
  uint64_t LowestPending() const KC_REQUIRES(mu_);

  // Immutable after construction.
  const EventBusOptions options_;

  mutable Mutex mu_;
  CondVar changed_;  // queue, delivery progress or running handler changed
  std::deque<Envelope> queue_ KC_GUARDED_BY(mu_);
  std::map<std::string, std::type_index> topic_types_ KC_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<const Handler>> handlers_ KC_GUARDED_BY(mu_);
  uint64_t next_id_ KC_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ KC_GUARDED_BY(mu_) = 0;    // seq of the next accepted event
  bool delivering_ KC_GUARDED_BY(mu_) = false;  // an event is off the queue, not yet done
  uint64_t delivering_seq_ KC_GUARDED_BY(mu_) = 0;
  uint64_t running_handler_ KC_GUARDED_BY(mu_) = 0;  // id of the callback running now, or 0
  bool stopping_ KC_GUARDED_BY(mu_) = false;
  Stats stats_ KC_GUARDED_BY(mu_);

  // Declared last: joined before the state above is destroyed.
  std::jthread dispatcher_;
};

}  // namespace kc
