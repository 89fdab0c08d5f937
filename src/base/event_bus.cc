#include "base/event_bus.h"

#include <utility>

#include "base/log.h"

namespace kc {

Subscription::Subscription(Subscription&& other) noexcept
    : bus_(std::exchange(other.bus_, nullptr)), id_(other.id_) {}

Subscription& Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    Cancel();
    bus_ = std::exchange(other.bus_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

Subscription::~Subscription() { Cancel(); }

void Subscription::Cancel() {
  if (bus_ == nullptr) return;
  std::exchange(bus_, nullptr)->Unsubscribe(id_);
}

EventBus::EventBus(EventBusOptions options)
    : options_(std::move(options)), dispatcher_([this] { Run(); }) {
  KC_CHECK(options_.queue_capacity > 0) << "EventBus queue_capacity must be positive";
  KC_CHECK(options_.clock != nullptr);
}

EventBus::~EventBus() {
  {
    MutexLock lock(&mu_);
    KC_CHECK(handlers_.empty()) << "EventBus '" << options_.name << "' destroyed with "
                                << handlers_.size() << " live subscriptions";
    stopping_ = true;
    changed_.SignalAll();
  }
  dispatcher_.join();
}

bool EventBus::OnDispatcherThread() const {
  return std::this_thread::get_id() == dispatcher_.get_id();
}

Status EventBus::CheckType(const std::string& topic, std::type_index type) {
  auto [it, inserted] = topic_types_.emplace(topic, type);
  if (!inserted && it->second != type) {
    return InvalidArgumentError("event bus '" + options_.name + "': topic '" + topic +
                                "' carries " + it->second.name() + ", not " + type.name());
  }
  return OkStatus();
}

Result<Subscription> EventBus::SubscribeErased(const std::string& topic, std::type_index type,
                                               ErasedHandler fn) {
  MutexLock lock(&mu_);
  KC_RETURN_IF_ERROR(CheckType(topic, type));
  const uint64_t id = next_id_++;
  handlers_.emplace(id, std::make_shared<const Handler>(Handler{id, topic, std::move(fn)}));
  return Subscription(this, id);
}

void EventBus::Unsubscribe(uint64_t id) {
  MutexLock lock(&mu_);
  handlers_.erase(id);
  if (OnDispatcherThread()) return;  // called from a callback: it finishes normally
  while (running_handler_ == id) changed_.Wait(&mu_);
}

Status EventBus::PublishErased(const std::string& topic, std::type_index type,
                               std::shared_ptr<const void> event) {
  MutexLock lock(&mu_);
  KC_RETURN_IF_ERROR(CheckType(topic, type));
  if (stopping_) return CancelledError("event bus '" + options_.name + "' is shutting down");
  if (queue_.size() >= options_.queue_capacity) {
    switch (options_.overflow) {
      case OverflowPolicy::kDropOldest:
        queue_.pop_front();
        ++stats_.dropped;
        break;
      case OverflowPolicy::kRejectNew:
        ++stats_.dropped;
        return ResourceExhaustedError("event bus '" + options_.name + "': queue full (" +
                                      std::to_string(options_.queue_capacity) +
                                      " events), topic '" + topic + "' event rejected");
      case OverflowPolicy::kBlock: {
        if (OnDispatcherThread()) {
          ++stats_.dropped;
          return ResourceExhaustedError("event bus '" + options_.name +
                                        "': queue full and publishing from a subscriber "
                                        "callback cannot wait, topic '" +
                                        topic + "'");
        }
        const TimePoint deadline = options_.clock->Now() + options_.publish_timeout;
        const bool room =
            AwaitWithDeadline(options_.clock, &changed_, &mu_, deadline, [this]() KC_REQUIRES(mu_) {
              return stopping_ || queue_.size() < options_.queue_capacity;
            });
        if (stopping_) return CancelledError("event bus '" + options_.name + "' is shutting down");
        if (!room) {
          ++stats_.dropped;
          return DeadlineExceededError(
              "event bus '" + options_.name + "': queue full for " +
              std::to_string(
                  std::chrono::duration_cast<std::chrono::milliseconds>(options_.publish_timeout)
                      .count()) +
              " ms, topic '" + topic + "'");
        }
        break;
      }
    }
  }
  queue_.push_back(Envelope{topic, std::move(event), next_seq_++});
  ++stats_.published;
  if (queue_.size() > stats_.queue_high_water) stats_.queue_high_water = queue_.size();
  changed_.SignalAll();
  return OkStatus();
}

uint64_t EventBus::LowestPending() const {
  if (delivering_) return delivering_seq_;
  return queue_.empty() ? next_seq_ : queue_.front().seq;
}

Status EventBus::Flush(TimePoint deadline) {
  if (OnDispatcherThread()) {
    return FailedPreconditionError("event bus '" + options_.name +
                                   "': Flush from a subscriber callback would wait for itself");
  }
  MutexLock lock(&mu_);
  const uint64_t target = next_seq_;
  const bool done = AwaitWithDeadline(options_.clock, &changed_, &mu_, deadline,
                                      [&]() KC_REQUIRES(mu_) { return LowestPending() >= target; });
  if (!done) {
    return DeadlineExceededError("event bus '" + options_.name + "': flush timed out with " +
                                 std::to_string(queue_.size()) + " events queued");
  }
  return OkStatus();
}

Status EventBus::Flush(Duration timeout) { return Flush(options_.clock->Now() + timeout); }

EventBus::Stats EventBus::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void EventBus::Run() {
  MutexLock lock(&mu_);
  for (;;) {
    while (queue_.empty() && !stopping_) changed_.Wait(&mu_);
    if (queue_.empty()) return;  // stopping, and everything queued was delivered
    Envelope env = std::move(queue_.front());
    queue_.pop_front();
    delivering_ = true;
    delivering_seq_ = env.seq;
    changed_.SignalAll();  // room in the queue for a blocked publisher
    // Copy the matching handlers, then call them without holding the lock.
    std::vector<std::shared_ptr<const Handler>> matching;
    for (const auto& [id, h] : handlers_) {
      if (h->topic == env.topic) matching.push_back(h);
    }
    for (const auto& h : matching) {
      if (handlers_.find(h->id) == handlers_.end()) continue;  // cancelled meanwhile
      running_handler_ = h->id;
      mu_.Unlock();
      h->fn(env.event.get());
      mu_.Lock();
      running_handler_ = 0;
      changed_.SignalAll();
    }
    ++stats_.delivered;
    delivering_ = false;
    changed_.SignalAll();
  }
}

}  // namespace kc
