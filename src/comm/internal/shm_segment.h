// What the two shared-memory mechanisms (comm/shm/shm_transport.cc, the message rings, and
// comm/shm/shm_direct.cc, the direct collectives) share: /dev/shm segments, their mappings,
// futex words in them, and telling whether a peer process is gone.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "base/status.h"

namespace kc::comm::internal {

// An mmap'd segment, unmapped when the owner goes. Move-only.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t bytes) : addr_(addr), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      Reset();
      addr_ = std::exchange(o.addr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { Reset(); }

  std::byte* get() const { return static_cast<std::byte*>(addr_); }
  // The segment's start as the header type T the caller laid out there.
  template <typename T>
  T* as() const {
    return static_cast<T*>(addr_);
  }

 private:
  void Reset();
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

// Unlinks a /dev/shm name when it goes out of scope, unless already unlinked.
class UnlinkGuard {
 public:
  explicit UnlinkGuard(std::string name) : name_(std::move(name)) {}
  ~UnlinkGuard() { Unlink(); }
  UnlinkGuard(const UnlinkGuard&) = delete;
  UnlinkGuard& operator=(const UnlinkGuard&) = delete;
  void Unlink();

 private:
  std::string name_;
};

// "what: strerror(err)" as kResourceExhausted (out of memory, space or descriptors) or
// kUnavailable.
Status ErrnoStatus(std::string_view what, int err);

// A new segment `name` (shm_open O_EXCL, mode 0600) of `bytes`, mapped read-write; the guard
// unlinks it unless the caller unlinks it first.
struct NewSegment {
  std::unique_ptr<UnlinkGuard> unlink;
  Mapping mapping;
};
Result<NewSegment> CreateSegment(const std::string& name, int64_t bytes);

// Maps peer rank `peer`'s segment `name`, which must hold exactly `bytes` (kDataLoss if not).
Result<Mapping> MapExisting(const std::string& name, int peer, int64_t bytes);

// A futex word inside a shared mapping. Not FUTEX_PRIVATE: the word is shared between
// processes.
inline uint32_t* FutexWord(std::atomic<uint32_t>* a) { return reinterpret_cast<uint32_t*>(a); }
void FutexWakeAll(std::atomic<uint32_t>* word);
// Sleeps while *word == expected, for at most `timeout_ns`; spurious wake-ups happen.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);

// "<prefix><group with non-alphanumerics as '_', at most 96 chars>-"
std::string SegmentPrefix(std::string_view prefix, std::string_view group);
// 16 random hex digits, for unguessable segment names.
std::string RandomHex();

// True when process `pid` is gone: no such process, or a zombie not yet reaped by its parent
// (a forked rank whose parent is itself a rank blocked in a collective). A recycled pid can
// hide a death until it is reused again.
bool ProcessDead(pid_t pid);

}  // namespace kc::comm::internal
