// The rendezvous store: a small key-value interface that ranks use to find each other
// (as gloo's rendezvous/store.h and c10d's Store). Implementations: HashStore (in memory,
// hash_store.h) and TcpStoreClient (tcp_store.h); rendezvous.h builds generations on top.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"

namespace kc::comm {

// Limits every implementation enforces: a longer key or value is kInvalidArgument.
inline constexpr size_t kMaxKeyBytes = 4 * 1024;
inline constexpr size_t kMaxValueBytes = 64 * 1024 * 1024;

// What CompareSet did.
struct CompareSetResult {
  bool swapped = false;  // `desired` was stored by this call
  // The key's value after the call (`desired` when swapped); nullopt when the key is absent.
  std::optional<std::string> current;
};

// A map from keys to values, both arbitrary byte strings (std::string, as leveldb's values).
// Keys are 1..kMaxKeyBytes bytes, values 0..kMaxValueBytes. Counters written by Add are
// decimal ASCII ("-12"), so Get reads them and Add continues a Set("7").
//
// Blocking calls take a deadline on clock(): for HashStore the clock it was built with, for
// TcpStoreClient the real steady clock; nothing waits forever. On TcpStoreClient calls
// without a deadline of their own are bounded by TcpStoreClientOptions::timeout, and every
// call may also fail with kUnavailable (the server is unreachable; retry), in which case a
// mutation may or may not have been applied.
//
// Implementations are safe for concurrent use.
class Store {
 public:
  virtual ~Store() = default;

  // Stores `value` under `key`, replacing any value. Wakes Get and Wait callers waiting for
  // it. kInvalidArgument for a bad key or a value over kMaxValueBytes.
  virtual Status Set(std::string_view key, std::string_view value) = 0;

  // The value under `key`. Blocks until the key exists, or until clock() reaches `deadline`:
  // then kDeadlineExceeded naming the key. HashStore answers a key that exists even when the
  // deadline has passed; over TCP the deadline covers the round trip.
  virtual Result<std::string> Get(std::string_view key, TimePoint deadline) = 0;

  // Blocks until every key in `keys` exists at once, or until `deadline`: kDeadlineExceeded
  // naming a missing key. Empty `keys`: OK at once.
  virtual Status Wait(std::span<const std::string> keys, TimePoint deadline) = 0;

  // Atomically adds `delta` to the counter under `key` (an absent key counts as 0) and
  // returns the new value. kFailedPrecondition when the value is not a decimal int64 or the
  // sum overflows; the value is then unchanged.
  virtual Result<int64_t> Add(std::string_view key, int64_t delta) = 0;

  // Atomically stores `desired` if the key's value equals `expected`, where nullopt expects
  // the key to be absent. Never blocks (beyond the round trip). Electing a leader:
  // CompareSet(k, nullopt, me); bumping a number: CompareSet(k, "3", "4").
  virtual Result<CompareSetResult> CompareSet(std::string_view key,
                                              std::optional<std::string_view> expected,
                                              std::string_view desired) = 0;

  // Removes `key`; true if it existed. Waiters for it keep waiting.
  virtual Result<bool> Delete(std::string_view key) = 0;

  // Whether every key in `keys` exists now (true for none). Never blocks.
  virtual Result<bool> Check(std::span<const std::string> keys) = 0;

  // The clock deadlines passed to this store are read on. Never null; not owned.
  virtual Clock* clock() const = 0;
};

// A view of `base` that puts `prefix` before every key (as c10d's PrefixStore), so that a
// generation or a subsystem gets its own key space: WithPrefix(&store, "kc/gen/3/"). The
// prefix counts towards kMaxKeyBytes. `base` is not owned and must outlive the view. Safe for
// concurrent use when `base` is.
std::unique_ptr<Store> WithPrefix(Store* base, std::string_view prefix);

// A view of `base` whose blocking calls (Get, Wait) give up with kAborted once `*cancelled`
// is true, instead of waiting out their deadline: they wait on `base` in slices of `slice`
// and look between them. A rendezvous a newer generation has made pointless ends so
// (fault::ElasticWorker). `base` and `cancelled` are not owned and must outlive the view.
std::unique_ptr<Store> WithCancel(Store* base, const std::atomic<bool>* cancelled,
                                  Duration slice = std::chrono::milliseconds(100));

}  // namespace kc::comm
