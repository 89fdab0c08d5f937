#include "comm/rate_limit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/notification.h"

namespace kc::comm {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;

TEST(TokenBucketTest, StartsFullAndRefillsAtItsRate) {
  FakeClock clock;
  TokenBucket bucket(/*rate_per_second=*/100, /*burst=*/50, &clock);
  EXPECT_DOUBLE_EQ(bucket.tokens(), 50);
  EXPECT_TRUE(bucket.TryTake(50));
  EXPECT_FALSE(bucket.TryTake(1));
  EXPECT_DOUBLE_EQ(bucket.tokens(), 0);
  EXPECT_EQ(bucket.TimeUntil(10), milliseconds(100));
  clock.Advance(milliseconds(99));
  EXPECT_FALSE(bucket.TryTake(10));
  clock.Advance(milliseconds(1));
  EXPECT_TRUE(bucket.TryTake(10));
  EXPECT_NEAR(bucket.tokens(), 0, 1e-9);
  clock.Advance(seconds(10));
  EXPECT_DOUBLE_EQ(bucket.tokens(), 50);  // capped at the burst
  EXPECT_EQ(bucket.TimeUntil(50), Duration::zero());
}

TEST(TokenBucketTest, WaitingTimeUntilAlwaysSuffices) {
  FakeClock clock;
  TokenBucket bucket(/*rate_per_second=*/3, /*burst=*/1, &clock);  // 1/3 s per token
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(bucket.TryTake(1)) << i;
    const Duration wait = bucket.TimeUntil(1);
    ASSERT_EQ(wait, nanoseconds(333'333'334)) << i;
    clock.Advance(wait - nanoseconds(1));
    ASSERT_FALSE(bucket.TryTake(1)) << i;
    clock.Advance(nanoseconds(1));
  }
}

// Rates from 1/s to 100 GB/s, requests below and above the burst: after TimeUntil(n) the
// request always passes, and two ticks earlier it does not (TimeUntil rounds up, so one tick
// earlier may already be enough when the exact time falls just past a tick).
TEST(TokenBucketTest, TimeUntilIsExactOverManyRatesAndSizes) {
  constexpr uint32_t kSeed = 20240611;
  SCOPED_TRACE("seed " + std::to_string(kSeed));
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<double> log_rate(0, 11);
  for (int trial = 0; trial < 2000; ++trial) {
    FakeClock clock;
    const double rate = std::pow(10.0, log_rate(rng));
    const double burst =
        std::max(1.0, std::floor(rate * std::uniform_real_distribution<>(0.01, 2)(rng)));
    TokenBucket bucket(rate, burst, &clock);
    const auto first = static_cast<int64_t>(burst * std::uniform_real_distribution<>(0, 3)(rng));
    const auto n = static_cast<int64_t>(burst * std::uniform_real_distribution<>(0, 3)(rng)) + 1;
    clock.Advance(bucket.TimeUntil(first));
    ASSERT_TRUE(bucket.TryTake(first)) << "trial " << trial;
    const Duration wait = bucket.TimeUntil(n);
    if (wait >= nanoseconds(2)) {
      clock.Advance(wait - nanoseconds(2));
      ASSERT_FALSE(bucket.TryTake(n)) << "trial " << trial << " rate " << rate << " n " << n;
      clock.Advance(nanoseconds(2));
    } else {
      clock.Advance(wait);
    }
    ASSERT_TRUE(bucket.TryTake(n)) << "trial " << trial << " rate " << rate << " n " << n;
  }
}

TEST(TokenBucketTest, ARequestAboveTheBurstWaitsForAFullBucketAndGoesNegative) {
  FakeClock clock;
  TokenBucket bucket(/*rate_per_second=*/100, /*burst=*/100, &clock);
  ASSERT_TRUE(bucket.TryTake(50));
  EXPECT_FALSE(bucket.TryTake(250));
  EXPECT_EQ(bucket.TimeUntil(250), milliseconds(500));  // until full
  clock.Advance(milliseconds(500));
  EXPECT_TRUE(bucket.TryTake(250));
  EXPECT_DOUBLE_EQ(bucket.tokens(), -150);
  // The debt is repaid before the next request: 1.5 s, then 0.1 s for 10 tokens.
  EXPECT_EQ(bucket.TimeUntil(10), milliseconds(1600));
}

class RateLimiterTest : public ::testing::Test {
 protected:
  std::unique_ptr<RateLimiter> Make(const RateLimit& limit) {
    Result<std::unique_ptr<RateLimiter>> r = RateLimiter::Create(limit, &clock_);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  TimePoint Far() const { return clock_.Now() + hours(1); }

  // 100 bytes/s, burst 100 bytes; operations are not the constraint.
  static constexpr RateLimit kBytes100 = {
      .ops_per_second = 1e6, .bytes_per_second = 100, .burst_ops = 1e6, .burst_bytes = 100};

  FakeClock clock_;
};

TEST_F(RateLimiterTest, CreateRejectsNonPositiveLimits) {
  RateLimit bad = kBytes100;
  bad.ops_per_second = 0;
  EXPECT_EQ(RateLimiter::Create(bad, &clock_).status().code(), ErrorCode::kInvalidArgument);
  bad = kBytes100;
  bad.burst_bytes = -1;
  EXPECT_EQ(RateLimiter::Create(bad, &clock_).status().code(), ErrorCode::kInvalidArgument);
  bad = kBytes100;
  bad.bytes_per_second = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(ValidateRateLimit(bad).code(), ErrorCode::kInvalidArgument);
  bad = kBytes100;
  bad.burst_ops = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ValidateRateLimit(bad).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(ValidateRateLimit(RateLimit{}).ok());
}

TEST_F(RateLimiterTest, AdmitsWithinTheBurstWithoutWaiting) {
  auto limiter = Make(kBytes100);
  EXPECT_TRUE(limiter->Acquire(60, clock_.Now()).ok());
  EXPECT_TRUE(limiter->Acquire(40, clock_.Now()).ok());
  EXPECT_EQ(limiter->Acquire(1, clock_.Now()).code(), ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(limiter->Acquire(-1, Far()).code(), ErrorCode::kInvalidArgument);
  RateLimiter::Metrics m = limiter->metrics();
  EXPECT_EQ(m.admitted_requests, 2u);
  EXPECT_EQ(m.admitted_bytes, 100);
  EXPECT_EQ(m.waited_requests, 0u);
  EXPECT_EQ(m.total_wait, Duration::zero());
  EXPECT_EQ(m.deadline_exceeded, 1u);
  EXPECT_EQ(m.current_waiters, 0);
}

TEST_F(RateLimiterTest, AWaiterIsVisibleInMetricsAndWakesWhenTheClockAdvances) {
  auto limiter = Make(kBytes100);
  ASSERT_TRUE(limiter->Acquire(100, clock_.Now()).ok());
  Status status;
  std::thread waiter([&] { status = limiter->Acquire(50, Far()); });
  clock_.BlockUntilWaiters(1);
  RateLimiter::Metrics m = limiter->metrics();
  EXPECT_EQ(m.current_waiters, 1);
  EXPECT_EQ(m.current_waiting_bytes, 50);
  EXPECT_EQ(m.admitted_requests, 1u);

  clock_.Advance(milliseconds(500));
  waiter.join();
  EXPECT_TRUE(status.ok()) << status;
  m = limiter->metrics();
  EXPECT_EQ(m.current_waiters, 0);
  EXPECT_EQ(m.current_waiting_bytes, 0);
  EXPECT_EQ(m.max_waiters, 1);
  EXPECT_EQ(m.admitted_requests, 2u);
  EXPECT_EQ(m.admitted_bytes, 150);
  EXPECT_EQ(m.waited_requests, 1u);
  EXPECT_EQ(m.total_wait, milliseconds(500));
  EXPECT_EQ(m.max_wait, milliseconds(500));
}

TEST_F(RateLimiterTest, GivesUpAtTheDeadlineWithoutTakingTokens) {
  auto limiter = Make(kBytes100);
  ASSERT_TRUE(limiter->Acquire(100, clock_.Now()).ok());
  Status status;
  std::thread waiter([&] { status = limiter->Acquire(50, clock_.Now() + milliseconds(200)); });
  clock_.BlockUntilWaiters(1);
  clock_.Advance(milliseconds(200));
  waiter.join();
  EXPECT_EQ(status.code(), ErrorCode::kDeadlineExceeded);
  RateLimiter::Metrics m = limiter->metrics();
  EXPECT_EQ(m.deadline_exceeded, 1u);
  EXPECT_EQ(m.current_waiters, 0);
  // The 20 bytes refilled meanwhile are still there.
  EXPECT_TRUE(limiter->Acquire(20, clock_.Now()).ok());
}

TEST_F(RateLimiterTest, ABigRequestQueuedFirstIsServedBeforeLaterSmallOnes) {
  auto limiter = Make(kBytes100);
  ASSERT_TRUE(limiter->Acquire(100, clock_.Now()).ok());
  Mutex mu;
  std::vector<std::string> order;
  Notification big_done;
  auto record = [&](const char* who) {
    MutexLock lock(&mu);
    order.push_back(who);
  };
  Status big_status;
  Status small_status;
  std::thread big([&] {
    big_status = limiter->Acquire(100, Far());
    record("big");
    big_done.Notify();
  });
  clock_.BlockUntilWaiters(1);
  std::thread small([&] {
    small_status = limiter->Acquire(10, Far());
    record("small");
  });
  clock_.BlockUntilWaiters(2);
  clock_.Advance(milliseconds(100));  // enough for the small request, not for the big one
  clock_.Advance(milliseconds(900));  // enough for the big one
  big_done.WaitForNotification();
  clock_.Advance(milliseconds(100));  // the small one's 10 bytes
  big.join();
  small.join();
  EXPECT_TRUE(big_status.ok());
  EXPECT_TRUE(small_status.ok());
  MutexLock lock(&mu);
  EXPECT_THAT(order, ElementsAre("big", "small"));
}

TEST_F(RateLimiterTest, ALaterSmallRequestDoesNotOvertakeAWaitingBigOne) {
  auto limiter = Make(kBytes100);
  ASSERT_TRUE(limiter->Acquire(100, clock_.Now()).ok());
  Status big_status;
  Status small_status;
  std::thread big([&] { big_status = limiter->Acquire(100, Far()); });
  clock_.BlockUntilWaiters(1);
  std::thread small([&] { small_status = limiter->Acquire(10, clock_.Now() + milliseconds(500)); });
  clock_.BlockUntilWaiters(2);
  // At 500 ms the bucket holds 50 bytes, five times what the small request needs, but the
  // big request is ahead of it.
  clock_.Advance(milliseconds(500));
  small.join();
  EXPECT_EQ(small_status.code(), ErrorCode::kDeadlineExceeded);
  clock_.Advance(milliseconds(500));
  big.join();
  EXPECT_TRUE(big_status.ok());
}

TEST_F(RateLimiterTest, ARequestAboveTheBurstIsAdmittedAndRepaid) {
  auto limiter = Make(kBytes100);
  EXPECT_TRUE(limiter->Acquire(250, clock_.Now()).ok());  // a full bucket admits it
  EXPECT_EQ(limiter->Acquire(10, clock_.Now()).code(), ErrorCode::kDeadlineExceeded);
  Status status;
  std::thread waiter([&] { status = limiter->Acquire(10, Far()); });
  clock_.BlockUntilWaiters(1);
  clock_.Advance(milliseconds(1600));  // 150 bytes of debt, then 10
  waiter.join();
  EXPECT_TRUE(status.ok());

  // Not full: the oversize request waits until the bucket is full, then goes through.
  std::thread oversize([&] { status = limiter->Acquire(1000, Far()); });
  clock_.BlockUntilWaiters(1);
  clock_.Advance(seconds(1));
  oversize.join();
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(limiter->metrics().admitted_bytes, 1260);
}

TEST_F(RateLimiterTest, TheOpsBucketLimitsToo) {
  auto limiter =
      Make({.ops_per_second = 2, .bytes_per_second = 1e9, .burst_ops = 2, .burst_bytes = 1e9});
  EXPECT_TRUE(limiter->Acquire(0, clock_.Now()).ok());
  EXPECT_TRUE(limiter->Acquire(0, clock_.Now()).ok());
  EXPECT_EQ(limiter->Acquire(0, clock_.Now()).code(), ErrorCode::kDeadlineExceeded);
  clock_.Advance(milliseconds(500));
  EXPECT_TRUE(limiter->Acquire(0, clock_.Now()).ok());
}

TEST_F(RateLimiterTest, CloseCancelsWaitersAndLaterCalls) {
  auto limiter = Make(kBytes100);
  ASSERT_TRUE(limiter->Acquire(100, clock_.Now()).ok());
  Status status;
  std::thread waiter([&] { status = limiter->Acquire(10, Far()); });
  clock_.BlockUntilWaiters(1);
  limiter->Close();
  waiter.join();
  EXPECT_EQ(status.code(), ErrorCode::kCancelled);
  EXPECT_EQ(limiter->Acquire(0, Far()).code(), ErrorCode::kCancelled);
  EXPECT_EQ(limiter->metrics().cancelled, 2u);
  EXPECT_EQ(limiter->metrics().current_waiters, 0);
}

// Four threads acquire 8 times each against one operation per second: the test advances the
// clock one second at a time, after each admission, so exactly one request passes per step.
TEST_F(RateLimiterTest, ConcurrentAcquirersAreEachAdmittedExactlyOnce) {
  auto limiter =
      Make({.ops_per_second = 1, .bytes_per_second = 1e12, .burst_ops = 1, .burst_bytes = 1e12});
  constexpr int kThreads = 4;
  constexpr int kPerThread = 8;
  Mutex mu;
  CondVar admitted_cv;
  int admitted = 0;
  std::vector<int> per_thread(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const Status s = limiter->Acquire(t + 1, Far());
        MutexLock lock(&mu);
        if (s.ok()) ++per_thread[static_cast<size_t>(t)];
        ++admitted;
        admitted_cv.SignalAll();
      }
    });
  }
  auto wait_for = [&](int n) {
    MutexLock lock(&mu);
    while (admitted < n) admitted_cv.Wait(&mu);
  };
  for (int n = 1; n < kThreads * kPerThread; ++n) {
    wait_for(n);
    clock_.Advance(seconds(1));
  }
  wait_for(kThreads * kPerThread);
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(per_thread, ElementsAre(kPerThread, kPerThread, kPerThread, kPerThread));
  RateLimiter::Metrics m = limiter->metrics();
  EXPECT_EQ(m.admitted_requests, static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(m.admitted_bytes, (1 + 2 + 3 + 4) * kPerThread);
  EXPECT_EQ(m.current_waiters, 0);
  EXPECT_LE(m.max_waiters, kThreads);
  EXPECT_EQ(m.deadline_exceeded, 0u);
}

}  // namespace
}  // namespace kc::comm
