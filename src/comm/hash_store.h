// An in-memory Store (as gloo's rendezvous/hash_store.h): ranks running as threads of one
// process share it in tests, and the TCP store server keeps its map in one.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "comm/store.h"

namespace kc::comm {

// A Store held in this process's memory. Deadlines are read on the clock it was built with,
// so a FakeClock decides when blocked Get and Wait calls give up. Safe for concurrent use.
class HashStore final : public Store {
 public:
  // `clock` is not owned and must outlive the store (Clock::Real() always does).
  explicit HashStore(Clock* clock = Clock::Real());
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  Status Set(std::string_view key, std::string_view value) override;
  Result<std::string> Get(std::string_view key, TimePoint deadline) override;
  Status Wait(std::span<const std::string> keys, TimePoint deadline) override;
  Result<int64_t> Add(std::string_view key, int64_t delta) override;
  Result<CompareSetResult> CompareSet(std::string_view key,
                                      std::optional<std::string_view> expected,
                                      std::string_view desired) override;
  Result<bool> Delete(std::string_view key) override;
  Result<bool> Check(std::span<const std::string> keys) override;
  Clock* clock() const override { return clock_; }

  // The value under `key` if it exists, without waiting (the TCP server's parked waiters
  // use it). Not a Store call: no deadline, no layer guard.
  std::optional<std::string> Peek(std::string_view key) const;

 private:
  bool Contains(std::string_view key) const KC_REQUIRES(mu_) {
    return map_.find(key) != map_.end();
  }

  // Immutable after construction.
  Clock* const clock_;  // not owned; outlives the store (see the constructor)

  mutable Mutex mu_;
  CondVar changed_;  // signalled whenever a key is created or replaced
  // Guarded by mu_.
  std::map<std::string, std::string, std::less<>> map_ KC_GUARDED_BY(mu_);
};

}  // namespace kc::comm
