#include "fault/heartbeat.h"

#include <algorithm>

namespace kc::fault {

std::string HeartbeatKey(int rank) { return std::string(kHeartbeatPrefix) + std::to_string(rank); }

Result<std::unique_ptr<Heartbeat>> Heartbeat::Start(comm::Store* store, int rank, Seconds period) {
  if (store == nullptr) return InvalidArgumentError("heartbeat: no store");
  if (!(period.count() > 0)) return InvalidArgumentError("heartbeat period: must be positive");
  std::unique_ptr<Heartbeat> h(new Heartbeat(store, rank, period));
  KC_RETURN_IF_ERROR(store->Set(HeartbeatKey(rank), "0"));  // at once: the first beat
  h->thread_ = std::thread([p = h.get()] { p->Loop(); });
  return h;
}

Heartbeat::~Heartbeat() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

int64_t Heartbeat::beats() const {
  MutexLock lock(&mu_);
  return beats_;
}

void Heartbeat::Loop() {
  const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(period_);
  MutexLock lock(&mu_);
  while (!stop_) {
    const int64_t beat = ++beats_;
    mu_.Unlock();
    // A failed Set (the store gone) is the supervisor's to notice; keep beating.
    store_->Set(HeartbeatKey(rank_), std::to_string(beat)).IgnoreError();
    mu_.Lock();
    const auto until = std::chrono::steady_clock::now() + period;
    while (!stop_ && std::chrono::steady_clock::now() < until) cv_.WaitUntil(&mu_, until);
  }
}

Status ValidateHeartbeat(const HeartbeatOptions& o) {
  if (!(o.period.count() > 0) || !(o.timeout.count() > 0)) {
    return InvalidArgumentError("heartbeat period and timeout: must be positive");
  }
  if (o.timeout < 2 * o.period) {
    return InvalidArgumentError("heartbeat timeout " + std::to_string(o.timeout.count()) +
                                " s: must be at least two periods (" +
                                std::to_string(2 * o.period.count()) +
                                " s), or one late beat "
                                "would fail a healthy rank");
  }
  return OkStatus();
}

HeartbeatMonitor::HeartbeatMonitor(comm::Store* store, int ranks, HeartbeatOptions options,
                                   Clock::time_point start)
    : store_(store),
      options_(options),
      last_value_(static_cast<size_t>(ranks)),
      last_change_(static_cast<size_t>(ranks), start),
      watched_(static_cast<size_t>(ranks), true),
      heard_(static_cast<size_t>(ranks), false),
      silent_for_(static_cast<size_t>(ranks), Seconds(0)) {}

void HeartbeatMonitor::Forget(int rank) { watched_.at(static_cast<size_t>(rank)) = false; }

void HeartbeatMonitor::Watch(int rank, Clock::time_point start) {
  const size_t r = static_cast<size_t>(rank);
  if (r >= watched_.size()) {
    last_value_.resize(r + 1);
    last_change_.resize(r + 1, start);
    watched_.resize(r + 1, false);
    heard_.resize(r + 1, false);
    silent_for_.resize(r + 1, Seconds(0));
  }
  watched_[r] = true;
  heard_[r] = false;
  last_change_[r] = start;
  last_value_[r].clear();
}

std::vector<int> HeartbeatMonitor::Check(Clock::time_point now) {
  std::vector<int> silent;
  for (size_t r = 0; r < watched_.size(); ++r) {
    if (!watched_[r]) continue;
    const std::string key = HeartbeatKey(static_cast<int>(r));
    const std::string keys[1] = {key};
    Result<bool> present = store_->Check(keys);
    if (present.ok() && *present) {
      // The key exists: the deadline only bounds the round trip.
      Result<std::string> value = store_->Get(
          key, store_->clock()->Now() +
                   std::chrono::duration_cast<Duration>(std::max(options_.period, Seconds(1))));
      if (value.ok() && *value != last_value_[r]) {
        last_value_[r] = *value;
        last_change_[r] = now;
        heard_[r] = true;
        continue;
      }
    }
    const Seconds quiet = now - last_change_[r];
    if (quiet > (heard_[r] ? options_.timeout : std::max(options_.timeout, options_.first_beat))) {
      silent_for_[r] = quiet;
      watched_[r] = false;
      silent.push_back(static_cast<int>(r));
    }
  }
  return silent;
}

}  // namespace kc::fault
