// TokenBucket and the FIFO RateLimiter built from two of them.
#include "comm/rate_limit.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>

#include "base/check.h"
#include "base/layer_guard.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"

namespace kc::comm {
namespace {

// Refill arithmetic is in double. A request counts as allowed when it is short by no more
// than this, so that waiting exactly TimeUntil(n) always suffices despite rounding.
double Tolerance(double need) { return 1e-12 * std::max(1.0, std::fabs(need)); }

}  // namespace

TokenBucket::TokenBucket(double rate_per_second, double burst, Clock* clock)
    : rate_(rate_per_second), burst_(burst), clock_(clock), tokens_(burst), last_(clock->Now()) {
  KC_CHECK(rate_per_second > 0 && burst > 0) << "TokenBucket needs a positive rate and burst";
}

double TokenBucket::TokensAt(TimePoint t) const {
  if (t <= last_) return tokens_;
  const double elapsed_s = std::chrono::duration<double>(t - last_).count();
  return std::min(burst_, tokens_ + rate_ * elapsed_s);
}

bool TokenBucket::TryTake(int64_t n) {
  KC_DCHECK(n >= 0);
  const TimePoint now = clock_->Now();
  const double have = TokensAt(now);
  const double need = std::min(static_cast<double>(n), burst_);
  if (have + Tolerance(need) < need) return false;
  tokens_ = have - static_cast<double>(n);
  last_ = std::max(last_, now);
  return true;
}

Duration TokenBucket::TimeUntil(int64_t n) const {
  const double need = std::min(static_cast<double>(n), burst_);
  const double deficit = need - TokensAt(clock_->Now());
  if (deficit <= Tolerance(need)) return Duration::zero();
  return std::chrono::ceil<Duration>(std::chrono::duration<double>(deficit / rate_));
}

double TokenBucket::tokens() const { return TokensAt(clock_->Now()); }

Status ValidateRateLimit(const RateLimit& limit) {
  const struct {
    const char* name;
    double value;
  } fields[] = {{"ops_per_second", limit.ops_per_second},
                {"bytes_per_second", limit.bytes_per_second},
                {"burst_ops", limit.burst_ops},
                {"burst_bytes", limit.burst_bytes}};
  for (const auto& f : fields) {
    if (!(f.value > 0) || !std::isfinite(f.value)) {
      return InvalidArgumentError(std::string("rate limit: ") + f.name +
                                  " must be a positive finite number, got " +
                                  std::to_string(f.value));
    }
  }
  return OkStatus();
}

namespace {

class RateLimiterImpl final : public RateLimiter {
 public:
  RateLimiterImpl(const RateLimit& limit, Clock* clock)
      : limit_(limit),
        clock_(clock),
        ops_(limit.ops_per_second, limit.burst_ops, clock),
        bytes_(limit.bytes_per_second, limit.burst_bytes, clock) {}

  ~RateLimiterImpl() override {
    MutexLock lock(&mu_);
    KC_CHECK(queue_.empty()) << "RateLimiter destroyed while " << queue_.size()
                             << " Acquire calls wait";
  }

  Status Acquire(int64_t bytes, TimePoint deadline) override;
  void Close() override;
  Metrics metrics() const override;
  const RateLimit& limit() const override { return limit_; }

 private:
  // Zero if both buckets allow one operation of `bytes` now, else how long until they do.
  Duration TimeUntilAllowed(int64_t bytes) const KC_REQUIRES(mu_) {
    return std::max(ops_.TimeUntil(1), bytes_.TimeUntil(bytes));
  }
  // Takes the tokens and counts the admission. REQUIRES: TimeUntilAllowed(bytes) is zero.
  void Admit(int64_t bytes, TimePoint arrived, bool waited) KC_REQUIRES(mu_);
  // Waits until `ticket` heads the queue and the buckets allow it, or until the deadline
  // or Close. Takes the tokens on success.
  Status WaitInQueue(uint64_t ticket, int64_t bytes, TimePoint arrived, TimePoint deadline)
      KC_REQUIRES(mu_);

  // Immutable after construction.
  const RateLimit limit_;
  Clock* const clock_;  // not owned; outlives this (Create's contract)

  mutable Mutex mu_;
  CondVar cv_;  // the queue's head changed, or Close
  // Guarded by mu_.
  TokenBucket ops_ KC_GUARDED_BY(mu_);
  TokenBucket bytes_ KC_GUARDED_BY(mu_);
  std::deque<uint64_t> queue_ KC_GUARDED_BY(mu_);  // tickets of waiting requests, FIFO
  uint64_t next_ticket_ KC_GUARDED_BY(mu_) = 0;
  bool closed_ KC_GUARDED_BY(mu_) = false;
  Metrics metrics_ KC_GUARDED_BY(mu_);
};

Status RateLimiterImpl::Acquire(int64_t bytes, TimePoint deadline) {
  KC_LAYER_ENTRY(Layer::kComm, "rate_limiter");
  if (bytes < 0) {
    return InvalidArgumentError("rate limiter: negative byte count " + std::to_string(bytes));
  }
  MutexLock lock(&mu_);
  if (closed_) {
    ++metrics_.cancelled;
    return CancelledError("rate limiter: closed");
  }
  const TimePoint arrived = clock_->Now();
  // Fast path: nobody waits and the buckets allow it.
  if (queue_.empty() && TimeUntilAllowed(bytes) == Duration::zero()) {
    Admit(bytes, arrived, /*waited=*/false);
    return OkStatus();
  }
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  ++metrics_.current_waiters;
  metrics_.current_waiting_bytes += bytes;
  metrics_.max_waiters = std::max(metrics_.max_waiters, metrics_.current_waiters);

  Status result = WaitInQueue(ticket, bytes, arrived, deadline);

  queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
  --metrics_.current_waiters;
  metrics_.current_waiting_bytes -= bytes;
  cv_.SignalAll();  // the next request may head the queue now
  return result;
}

Status RateLimiterImpl::WaitInQueue(uint64_t ticket, int64_t bytes, TimePoint arrived,
                                    TimePoint deadline) {
  while (true) {
    if (closed_) {
      ++metrics_.cancelled;
      return CancelledError("rate limiter: closed while waiting");
    }
    const TimePoint now = clock_->Now();
    TimePoint wake = deadline;
    if (queue_.front() == ticket) {
      // Only the head may take tokens: later requests never overtake it.
      const Duration wait = TimeUntilAllowed(bytes);
      if (wait == Duration::zero()) {
        Admit(bytes, arrived, /*waited=*/true);
        return OkStatus();
      }
      wake = std::min(deadline, now + wait);
    }
    if (now >= deadline) {
      ++metrics_.deadline_exceeded;
      return DeadlineExceededError("rate limiter: not admitted before the deadline (" +
                                   std::to_string(bytes) + " bytes)");
    }
    clock_->WaitUntil(&cv_, &mu_, wake);
  }
}

void RateLimiterImpl::Admit(int64_t bytes, TimePoint arrived, bool waited) {
  const bool took_op = ops_.TryTake(1);
  const bool took_bytes = bytes_.TryTake(bytes);
  // Time only moves forward and nobody else takes tokens under mu_, so both still allow it.
  KC_CHECK(took_op && took_bytes) << "rate limiter: buckets refused an allowed request";
  const Duration wait = clock_->Now() - arrived;
  ++metrics_.admitted_requests;
  metrics_.admitted_bytes += bytes;
  if (waited) ++metrics_.waited_requests;
  metrics_.total_wait += wait;
  metrics_.max_wait = std::max(metrics_.max_wait, wait);
}

void RateLimiterImpl::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

RateLimiter::Metrics RateLimiterImpl::metrics() const {
  MutexLock lock(&mu_);
  return metrics_;
}

}  // namespace

Result<std::unique_ptr<RateLimiter>> RateLimiter::Create(const RateLimit& limit, Clock* clock) {
  KC_LAYER_ENTRY(Layer::kComm, "rate_limiter");
  KC_CHECK(clock != nullptr) << "RateLimiter needs a clock";
  KC_RETURN_IF_ERROR(ValidateRateLimit(limit));
  return std::unique_ptr<RateLimiter>(std::make_unique<RateLimiterImpl>(limit, clock));
}

}  // namespace kc::comm
