#include "comm/hash_store.h"

#include <limits>

#include "base/layer_guard.h"
#include "comm/internal/store_wire.h"

namespace kc::comm {

using internal::QuoteKey;
using internal::ValidateKey;
using internal::ValidateValue;

// Every store entry point is one component, "store", whatever the instance (nullptr): a
// PrefixStore or a rendezvous helper calling its base store is the store calling itself.
// Another L2 component blocking on the store is still reported as a peer blocking call.

HashStore::HashStore(Clock* clock) : clock_(clock) {}

Status HashStore::Set(std::string_view key, std::string_view value) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  KC_RETURN_IF_ERROR(ValidateKey("store set", key));
  KC_RETURN_IF_ERROR(ValidateValue("store set", key, value));
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    map_.emplace(std::string(key), std::string(value));
  } else {
    it->second.assign(value);
  }
  changed_.SignalAll();
  return OkStatus();
}

Result<std::string> HashStore::Get(std::string_view key, TimePoint deadline) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  KC_RETURN_IF_ERROR(ValidateKey("store get", key));
  MutexLock lock(&mu_);
  if (!AwaitWithDeadline(clock_, &changed_, &mu_, deadline,
                         [&]() KC_REQUIRES(mu_) { return Contains(key); })) {
    return DeadlineExceededError("store get key=" + QuoteKey(key) +
                                 ": not set before the deadline");
  }
  return map_.find(key)->second;
}

Status HashStore::Wait(std::span<const std::string> keys, TimePoint deadline) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  for (const std::string& k : keys) KC_RETURN_IF_ERROR(ValidateKey("store wait", k));
  MutexLock lock(&mu_);
  const std::string* missing = nullptr;
  const bool all = AwaitWithDeadline(clock_, &changed_, &mu_, deadline, [&]() KC_REQUIRES(mu_) {
    for (const std::string& k : keys) {
      if (!Contains(k)) {
        missing = &k;
        return false;
      }
    }
    return true;
  });
  if (!all) {
    return DeadlineExceededError("store wait key=" + QuoteKey(*missing) +
                                 ": not set before the deadline (" + std::to_string(keys.size()) +
                                 " keys awaited)");
  }
  return OkStatus();
}

Result<int64_t> HashStore::Add(std::string_view key, int64_t delta) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  KC_RETURN_IF_ERROR(ValidateKey("store add", key));
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  int64_t value = 0;
  if (it != map_.end()) {
    const std::optional<int64_t> old = internal::ParseCounter(it->second);
    if (!old.has_value()) {
      return FailedPreconditionError("store add key=" + QuoteKey(key) +
                                     ": the value is not a decimal integer");
    }
    value = *old;
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    return FailedPreconditionError("store add key=" + QuoteKey(key) + " delta=" +
                                   std::to_string(delta) + ": the counter would overflow");
  }
  if (it == map_.end()) {
    map_.emplace(std::string(key), std::to_string(value));
  } else {
    it->second = std::to_string(value);
  }
  changed_.SignalAll();
  return value;
}

Result<CompareSetResult> HashStore::CompareSet(std::string_view key,
                                               std::optional<std::string_view> expected,
                                               std::string_view desired) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  KC_RETURN_IF_ERROR(ValidateKey("store compare_set", key));
  KC_RETURN_IF_ERROR(ValidateValue("store compare_set", key, desired));
  if (expected.has_value()) {
    KC_RETURN_IF_ERROR(ValidateValue("store compare_set", key, *expected));
  }
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  const bool matches =
      it == map_.end() ? !expected.has_value() : expected.has_value() && it->second == *expected;
  if (!matches) {
    CompareSetResult r{.swapped = false, .current = std::nullopt};
    if (it != map_.end()) r.current = it->second;
    return r;
  }
  if (it == map_.end()) {
    map_.emplace(std::string(key), std::string(desired));
  } else {
    it->second.assign(desired);
  }
  changed_.SignalAll();
  return CompareSetResult{.swapped = true, .current = std::string(desired)};
}

Result<bool> HashStore::Delete(std::string_view key) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  KC_RETURN_IF_ERROR(ValidateKey("store delete", key));
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  map_.erase(it);
  return true;
}

Result<bool> HashStore::Check(std::span<const std::string> keys) {
  KC_LAYER_ENTRY(Layer::kComm, "store");
  for (const std::string& k : keys) KC_RETURN_IF_ERROR(ValidateKey("store check", k));
  MutexLock lock(&mu_);
  for (const std::string& k : keys) {
    if (!Contains(k)) return false;
  }
  return true;
}

std::optional<std::string> HashStore::Peek(std::string_view key) const {
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kc::comm
