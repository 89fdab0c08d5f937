// A one-shot event (as absl::Notification): one thread notifies, any number wait.
// Notify() happens-before every wait that returns true.
#pragma once

#include "base/clock.h"
#include "base/mutex.h"

namespace kc {

// Safe for concurrent use.
class Notification {
 public:
  Notification() = default;
  Notification(const Notification&) = delete;
  Notification& operator=(const Notification&) = delete;

  // REQUIRES: not notified yet.
  void Notify();
  bool HasBeenNotified() const;
  // Blocks until notified.
  void WaitForNotification() const;
  // Blocks until notified or `clock` reaches `deadline`; true if notified.
  bool WaitForNotificationWithDeadline(Clock* clock, TimePoint deadline) const;

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool notified_ KC_GUARDED_BY(mu_) = false;
};

}  // namespace kc
