// Per-job rate limits on communication: a token bucket, and a RateLimiter that queues each
// operation until both the ops/s and the bytes/s bucket allow it. Excess is queued, never
// dropped (docs/design/lanes-and-rate-limits.md).
#pragma once

#include <cstdint>
#include <memory>

#include "base/clock.h"
#include "base/status.h"

namespace kc::comm {

// A token bucket on an injected clock: it refills at `rate_per_second` up to `burst` tokens
// and starts full. A request of n tokens is allowed when the bucket holds min(n, burst): a
// request larger than the burst waits for a full bucket and then takes it negative, so the
// debt is repaid before anything else passes and the long-run rate holds.
// Not thread-safe; RateLimiter serialises access to its buckets.
class TokenBucket {
 public:
  // REQUIRES: rate_per_second > 0, burst > 0, clock outlives the bucket (not owned).
  TokenBucket(double rate_per_second, double burst, Clock* clock);

  // Takes n tokens and returns true if the request is allowed now; else takes nothing.
  // REQUIRES: n >= 0.
  bool TryTake(int64_t n);
  // How long until TryTake(n) would succeed if nothing else takes tokens; zero if it would
  // now. Rounded up to the clock's tick, so TryTake succeeds once that much time passed.
  Duration TimeUntil(int64_t n) const;
  // The tokens held now, after refilling; negative while an oversize request is repaid.
  double tokens() const;

  double rate_per_second() const { return rate_; }
  double burst() const { return burst_; }

 private:
  // Tokens held at time t >= last_.
  double TokensAt(TimePoint t) const;

  // Immutable after construction.
  double rate_;
  double burst_;
  Clock* clock_;  // not owned; outlives this (constructor's contract)

  double tokens_;   // at last_
  TimePoint last_;  // when tokens_ was computed
};

// The limits of one job. Values come from the admin's configuration
// (comm/comm_limits_config.h), never from the job. A plain copyable value.
struct RateLimit {
  double ops_per_second = 10000;
  double bytes_per_second = 10e9;
  double burst_ops = 1000;
  double burst_bytes = 256e6;
};

// OK, or kInvalidArgument naming the first value that is not a positive finite number.
Status ValidateRateLimit(const RateLimit& limit);

// A job's rate limiter: each Acquire is one operation of some bytes, admitted when both the
// ops bucket and the bytes bucket allow it. Requests are served strictly first come, first
// served: a request waits until every earlier one has been admitted or has given up, so a
// large request is never starved by a stream of small ones (small ones queue behind it).
// Safe for concurrent use.
class RateLimiter {
 public:
  // Counters since creation; `current_*` describe the queue now.
  struct Metrics {
    uint64_t admitted_requests = 0;
    int64_t admitted_bytes = 0;
    uint64_t waited_requests = 0;  // admitted after waiting in the queue
    Duration total_wait{};         // over admitted requests, on the limiter's clock
    Duration max_wait{};
    int64_t current_waiters = 0;  // in the queue now, the one at its head included
    int64_t current_waiting_bytes = 0;
    int64_t max_waiters = 0;
    uint64_t deadline_exceeded = 0;
    uint64_t cancelled = 0;
  };

  // kInvalidArgument if ValidateRateLimit(limit) fails. `clock` is not owned and must
  // outlive the limiter.
  static Result<std::unique_ptr<RateLimiter>> Create(const RateLimit& limit, Clock* clock);

  // REQUIRES: no call is blocked in Acquire (Close first, and join the callers).
  virtual ~RateLimiter() = default;

  // Admits one operation of `bytes` bytes: returns OK once both buckets allow it and every
  // earlier request is through. Blocks until then, or until `clock` reaches `deadline`
  // (kDeadlineExceeded; nothing taken). kCancelled after Close() (also for a blocked call).
  // kInvalidArgument for negative bytes. A request above burst_bytes is admitted once the
  // bytes bucket is full, and takes it negative.
  virtual Status Acquire(int64_t bytes, TimePoint deadline) = 0;

  // Wakes every blocked Acquire with kCancelled; later calls return kCancelled. Idempotent.
  virtual void Close() = 0;

  // A snapshot; readable at any time, also while requests wait.
  virtual Metrics metrics() const = 0;

  virtual const RateLimit& limit() const = 0;
};

}  // namespace kc::comm
