// The real steady clock and the fake clock for tests.
#include "base/clock.h"

#include <algorithm>

#include "base/check.h"

namespace kc {
namespace {

class RealClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  bool WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) override KC_REQUIRES(mu) {
    return cv->WaitUntil(mu, deadline);
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

TimePoint FakeClock::Now() const {
  MutexLock lock(&mu_);
  return now_;
}

// Lock order: a waiter holds its own *mu and briefly takes mu_ to register; it never waits
// for mu_ while holding *mu. Advance never holds mu_ while it takes a waiter's *mu. A waiter
// leaves only after every Advance that saw it has finished signalling it (pins == 0), so
// Advance never touches a Mutex or CondVar that its owner has already destroyed.
bool FakeClock::WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) {
  Waiter self{cv, mu, 0};
  {
    MutexLock lock(&mu_);
    if (now_ >= deadline) return false;
    waiters_.push_back(&self);
    changed_.SignalAll();
  }
  cv->Wait(mu);
  mu->Unlock();
  bool before_deadline;
  {
    MutexLock lock(&mu_);
    while (self.pins > 0) changed_.Wait(&mu_);
    waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &self));
    before_deadline = now_ < deadline;
    changed_.SignalAll();
  }
  mu->Lock();
  return before_deadline;
}

void FakeClock::Advance(Duration d) {
  KC_CHECK(d >= Duration::zero()) << "FakeClock cannot go backwards";
  {
    MutexLock lock(&mu_);
    now_ += d;
  }
  WakeAll();
}

void FakeClock::SetTime(TimePoint t) {
  {
    MutexLock lock(&mu_);
    KC_CHECK(t >= now_) << "FakeClock cannot go backwards";
    now_ = t;
  }
  WakeAll();
}

void FakeClock::WakeAll() {
  std::vector<Waiter*> pinned;
  {
    MutexLock lock(&mu_);
    pinned = waiters_;
    for (Waiter* w : pinned) ++w->pins;
  }
  for (Waiter* w : pinned) {
    // Taking the waiter's mutex guarantees it is inside cv->Wait, so the signal is not lost.
    w->mu->Lock();
    w->cv->SignalAll();
    w->mu->Unlock();
  }
  MutexLock lock(&mu_);
  for (Waiter* w : pinned) --w->pins;
  changed_.SignalAll();
}

int FakeClock::num_waiters() const {
  MutexLock lock(&mu_);
  return static_cast<int>(waiters_.size());
}

void FakeClock::BlockUntilWaiters(int n) const {
  MutexLock lock(&mu_);
  while (static_cast<int>(waiters_.size()) < n) changed_.Wait(&mu_);
}

}  // namespace kc
