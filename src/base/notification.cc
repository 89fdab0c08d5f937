#include "base/notification.h"

#include "base/check.h"

namespace kc {

void Notification::Notify() {
  MutexLock lock(&mu_);
  KC_CHECK(!notified_) << "Notification notified twice";
  notified_ = true;
  cv_.SignalAll();
}

bool Notification::HasBeenNotified() const {
  MutexLock lock(&mu_);
  return notified_;
}

void Notification::WaitForNotification() const {
  MutexLock lock(&mu_);
  while (!notified_) cv_.Wait(&mu_);
}

bool Notification::WaitForNotificationWithDeadline(Clock* clock, TimePoint deadline) const {
  MutexLock lock(&mu_);
  return AwaitWithDeadline(clock, &cv_, &mu_, deadline,
                           [this]() KC_REQUIRES(mu_) { return notified_; });
}

}  // namespace kc
