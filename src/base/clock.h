// An injectable monotonic clock. Everything with a deadline takes a Clock so tests can use
// FakeClock and advance time instead of sleeping (STYLE.md §7, §9).
#pragma once

#include <chrono>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"

namespace kc {

using Duration = std::chrono::steady_clock::duration;
using TimePoint = std::chrono::steady_clock::time_point;

// A monotonic time source that can also bound a condition-variable wait by its own notion
// of time. Implementations are safe for concurrent use.
class Clock {
 public:
  virtual ~Clock() = default;

  virtual TimePoint Now() const = 0;

  // Releases *mu and waits on *cv until it is signalled or this clock reaches `deadline`,
  // then re-acquires *mu. Returns false if the deadline had passed. Wake-ups may be spurious:
  // callers loop on a predicate, or use AwaitWithDeadline below.
  virtual bool WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) KC_REQUIRES(mu) = 0;

  // The process-wide real steady clock. Never destroyed; safe to use from any thread.
  static Clock* Real();
};

// Waits until pred() holds or `clock` reaches `deadline`. Returns pred()'s final value.
// REQUIRES: *mu held; pred reads only state guarded by *mu. (The analysis cannot see that
// *mu is the mutex pred requires, so it is switched off for this body; annotate pred itself.)
template <typename Pred>
bool AwaitWithDeadline(Clock* clock, CondVar* cv, Mutex* mu, TimePoint deadline, Pred pred)
    KC_REQUIRES(mu) KC_NO_THREAD_SAFETY_ANALYSIS {
  while (!pred()) {
    if (clock->Now() >= deadline) return pred();
    clock->WaitUntil(cv, mu, deadline);
  }
  return true;
}

// A clock that moves only when told to. Waits bounded by it end when Advance() or SetTime()
// carries it past their deadline. Safe for concurrent use.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(TimePoint start = TimePoint{} + std::chrono::hours(1)) : now_(start) {}
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  TimePoint Now() const override;
  bool WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) override KC_REQUIRES(mu);

  // Moves time forward and wakes every waiter. REQUIRES: d >= 0; the caller holds no Mutex
  // that a waiter waits with.
  void Advance(Duration d);
  // Like Advance, to an absolute time. REQUIRES: t >= Now().
  void SetTime(TimePoint t);
  // The number of threads now blocked in WaitUntil; lets a test wait for a waiter to block.
  int num_waiters() const;
  // Blocks (in real time, on a condition variable) until at least n threads wait.
  void BlockUntilWaiters(int n) const;

 private:
  struct Waiter {
    CondVar* cv;
    Mutex* mu;
    int pins;  // Advance calls that still have to signal this waiter.
  };
  void WakeAll();

  mutable Mutex mu_;
  mutable CondVar changed_;
  TimePoint now_ KC_GUARDED_BY(mu_);
  std::vector<Waiter*> waiters_ KC_GUARDED_BY(mu_);
};

}  // namespace kc
