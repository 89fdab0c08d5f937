// Annotated Mutex, MutexLock and CondVar (as leveldb's port/ and util/mutexlock.h), so that
// clang's -Wthread-safety can check KC_GUARDED_BY fields.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace kc {

class CondVar;

// A non-recursive mutex. Safe for concurrent use.
class KC_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KC_ACQUIRE() { mu_.lock(); }
  void Unlock() KC_RELEASE() { mu_.unlock(); }
  bool TryLock() KC_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the lock (it is not checked at run time).
  void AssertHeld() const KC_THREAD_ANNOTATION(assert_capability(this)) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class KC_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KC_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() KC_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable bound at each wait to a Mutex the caller holds. Safe for concurrent
// use. Always wait in a loop on a predicate; spurious wake-ups happen.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases *mu, blocks until signalled, re-acquires *mu.
  void Wait(Mutex* mu) KC_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, but returns false once the steady clock passes `deadline`.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) KC_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return signalled;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kc
