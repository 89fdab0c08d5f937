#include "comm/store.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kc::comm {
namespace {

// Forwards every call to its base store with the prefix put before the keys. Carries no
// layer guard of its own: the base store's entry points are the guarded ones.
class PrefixStore final : public Store {
 public:
  PrefixStore(Store* base, std::string_view prefix) : base_(base), prefix_(prefix) {}

  Status Set(std::string_view key, std::string_view value) override {
    return base_->Set(Full(key), value);
  }
  Result<std::string> Get(std::string_view key, TimePoint deadline) override {
    return base_->Get(Full(key), deadline);
  }
  Status Wait(std::span<const std::string> keys, TimePoint deadline) override {
    return base_->Wait(Full(keys), deadline);
  }
  Result<int64_t> Add(std::string_view key, int64_t delta) override {
    return base_->Add(Full(key), delta);
  }
  Result<CompareSetResult> CompareSet(std::string_view key,
                                      std::optional<std::string_view> expected,
                                      std::string_view desired) override {
    return base_->CompareSet(Full(key), expected, desired);
  }
  Result<bool> Delete(std::string_view key) override { return base_->Delete(Full(key)); }
  Result<bool> Check(std::span<const std::string> keys) override {
    return base_->Check(Full(keys));
  }
  Clock* clock() const override { return base_->clock(); }

 private:
  // An empty key stays empty so that the base store reports it as such.
  std::string Full(std::string_view key) const {
    return key.empty() ? std::string() : prefix_ + std::string(key);
  }
  std::vector<std::string> Full(std::span<const std::string> keys) const {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(Full(k));
    return full;
  }

  // Immutable after construction.
  Store* const base_;  // not owned; the caller of WithPrefix keeps it alive (store.h)
  const std::string prefix_;
};

// Forwards every call; Get and Wait wait in slices, giving up once cancelled.
class CancellableStore final : public Store {
 public:
  CancellableStore(Store* base, const std::atomic<bool>* cancelled, Duration slice)
      : base_(base), cancelled_(cancelled), slice_(slice) {}

  Status Set(std::string_view key, std::string_view value) override {
    return base_->Set(key, value);
  }
  Result<std::string> Get(std::string_view key, TimePoint deadline) override {
    for (;;) {
      KC_RETURN_IF_ERROR(Cancelled(key));
      const TimePoint until = std::min(deadline, base_->clock()->Now() + slice_);
      Result<std::string> r = base_->Get(key, until);
      if (r.ok() || r.status().code() != ErrorCode::kDeadlineExceeded || until >= deadline) {
        return r;
      }
    }
  }
  Status Wait(std::span<const std::string> keys, TimePoint deadline) override {
    for (;;) {
      KC_RETURN_IF_ERROR(Cancelled(keys.empty() ? std::string_view() : keys.front()));
      const TimePoint until = std::min(deadline, base_->clock()->Now() + slice_);
      Status s = base_->Wait(keys, until);
      if (s.ok() || s.code() != ErrorCode::kDeadlineExceeded || until >= deadline) return s;
    }
  }
  Result<int64_t> Add(std::string_view key, int64_t delta) override {
    return base_->Add(key, delta);
  }
  Result<CompareSetResult> CompareSet(std::string_view key,
                                      std::optional<std::string_view> expected,
                                      std::string_view desired) override {
    return base_->CompareSet(key, expected, desired);
  }
  Result<bool> Delete(std::string_view key) override { return base_->Delete(key); }
  Result<bool> Check(std::span<const std::string> keys) override { return base_->Check(keys); }
  Clock* clock() const override { return base_->clock(); }

 private:
  Status Cancelled(std::string_view key) const {
    if (!cancelled_->load(std::memory_order_acquire)) return OkStatus();
    return AbortedError("store wait for key \"" + std::string(key) + "\": cancelled");
  }

  Store* const base_;
  const std::atomic<bool>* const cancelled_;
  const Duration slice_;
};

}  // namespace

std::unique_ptr<Store> WithPrefix(Store* base, std::string_view prefix) {
  return std::make_unique<PrefixStore>(base, prefix);
}

std::unique_ptr<Store> WithCancel(Store* base, const std::atomic<bool>* cancelled, Duration slice) {
  return std::make_unique<CancellableStore>(base, cancelled, slice);
}

}  // namespace kc::comm
