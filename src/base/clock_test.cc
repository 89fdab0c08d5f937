#include "base/clock.h"

#include <gtest/gtest.h>

#include <thread>

#include "base/notification.h"

namespace kc {
namespace {

using std::chrono::seconds;

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  const TimePoint t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(seconds(5));
  EXPECT_EQ(clock.Now() - t0, seconds(5));
}

TEST(FakeClockTest, WaitEndsWhenTimePassesTheDeadline) {
  FakeClock clock;
  Mutex mu;
  CondVar cv;
  const TimePoint deadline = clock.Now() + seconds(30);
  bool result = true;
  std::thread waiter([&] {
    MutexLock lock(&mu);
    result = AwaitWithDeadline(&clock, &cv, &mu, deadline, [] { return false; });
  });
  clock.BlockUntilWaiters(1);
  clock.Advance(seconds(10));  // not yet past the deadline: the waiter goes back to waiting
  clock.BlockUntilWaiters(1);
  clock.Advance(seconds(25));
  waiter.join();
  EXPECT_FALSE(result);
}

TEST(FakeClockTest, WaitEndsWhenThePredicateHolds) {
  FakeClock clock;
  Mutex mu;
  CondVar cv;
  bool ready = false;
  bool result = false;
  std::thread waiter([&] {
    MutexLock lock(&mu);
    result = AwaitWithDeadline(&clock, &cv, &mu, clock.Now() + seconds(30),
                               [&]() KC_REQUIRES(mu) { return ready; });
  });
  clock.BlockUntilWaiters(1);
  {
    MutexLock lock(&mu);
    ready = true;
    cv.SignalAll();
  }
  waiter.join();
  EXPECT_TRUE(result);
}

TEST(FakeClockTest, PastDeadlineReturnsAtOnce) {
  FakeClock clock;
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  EXPECT_FALSE(clock.WaitUntil(&cv, &mu, clock.Now()));
}

TEST(NotificationTest, WaitReturnsAfterNotify) {
  Notification n;
  std::thread t([&] { n.Notify(); });
  n.WaitForNotification();
  EXPECT_TRUE(n.HasBeenNotified());
  t.join();
}

TEST(NotificationTest, DeadlineOnFakeClockTimesOut) {
  FakeClock clock;
  Notification n;
  bool notified = true;
  std::thread t(
      [&] { notified = n.WaitForNotificationWithDeadline(&clock, clock.Now() + seconds(1)); });
  clock.BlockUntilWaiters(1);
  clock.Advance(seconds(2));
  t.join();
  EXPECT_FALSE(notified);
}

TEST(RealClockTest, IsMonotonic) {
  const TimePoint a = Clock::Real()->Now();
  const TimePoint b = Clock::Real()->Now();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace kc
