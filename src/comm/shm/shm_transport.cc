// The shared-memory transport: one segment per rank holding the rings its peers write into,
// and one progress thread per endpoint moving bytes between posted requests and the rings.
#include "comm/shm/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <new>
#include <random>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/layer_guard.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "comm/internal/completion_request.h"
#include "hal/fd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KC_SHM_CPU_RELAX() _mm_pause()
#else
#define KC_SHM_CPU_RELAX() \
  do {                     \
  } while (false)
#endif

namespace kc::comm {
namespace {

constexpr uint64_t kMagic = 0x4b43'53484d'0001ull;  // "KC" "SHM" v1
constexpr int64_t kSegmentHeaderBytes = 256;
constexpr int64_t kRingHeaderBytes = 128;
constexpr int64_t kFrameHeaderBytes = 24;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(50);

enum SegmentState : uint32_t { kOpen = 0, kClosed = 1, kAborted = 2 };

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4);

// At offset 0 of a segment. Written once by the owner before its name is published, except
// the atomics.
struct SegmentHeader {
  uint64_t magic;
  int32_t rank;
  int32_t size;
  int32_t pid;
  int32_t reserved;
  uint64_t ring_bytes;
  alignas(64) std::atomic<uint32_t> state;     // SegmentState
  alignas(64) std::atomic<uint32_t> doorbell;  // futex word: bumped on every event for the owner
  std::atomic<uint32_t> sleepers;              // owner's progress thread is (about to be) asleep
};
static_assert(sizeof(SegmentHeader) <= kSegmentHeaderBytes);

// Before each ring's data. Byte counters since creation; the ring holds bytes [head, tail).
struct RingHeader {
  alignas(64) std::atomic<uint64_t> tail;  // written by the producer only
  alignas(64) std::atomic<uint64_t> head;  // written by the consumer only
};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);

struct FrameHeader {
  uint64_t tag;
  uint64_t size_bytes;
  uint32_t lane;
  uint32_t reserved;
};
static_assert(sizeof(FrameHeader) == kFrameHeaderBytes);

int64_t SegmentBytes(int size, int64_t ring_bytes) {
  return kSegmentHeaderBytes + int64_t{size} * (kRingHeaderBytes + ring_bytes);
}

RingHeader* RingAt(void* base, int sender, int64_t ring_bytes) {
  return reinterpret_cast<RingHeader*>(static_cast<std::byte*>(base) + kSegmentHeaderBytes +
                                       int64_t{sender} * (kRingHeaderBytes + ring_bytes));
}
std::byte* RingData(RingHeader* ring) {
  return reinterpret_cast<std::byte*>(ring) + kRingHeaderBytes;
}

uint32_t* FutexWord(std::atomic<uint32_t>* a) { return reinterpret_cast<uint32_t*>(a); }

// Wakes the segment owner's progress thread. The seq_cst bump followed by the seq_cst load of
// sleepers pairs with the sleeper's seq_cst increment of sleepers followed by its seq_cst
// load of doorbell: either we see the sleeper, or it sees the new doorbell value.
void Ring(SegmentHeader* h) {
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, FutexWord(&h->doorbell), FUTEX_WAKE, std::numeric_limits<int>::max(),
            nullptr, nullptr, 0);
  }
}

// Copies between a flat buffer and ring positions [pos, pos + n), wrapping at `cap`.
void CopyIn(std::byte* ring, int64_t cap, uint64_t pos, const std::byte* src, int64_t n) {
  const int64_t at = static_cast<int64_t>(pos % static_cast<uint64_t>(cap));
  const int64_t first = std::min(n, cap - at);
  if (first > 0) std::memcpy(ring + at, src, first);
  if (n > first) std::memcpy(ring, src + first, n - first);
}
void CopyOut(const std::byte* ring, int64_t cap, uint64_t pos, std::byte* dst, int64_t n) {
  const int64_t at = static_cast<int64_t>(pos % static_cast<uint64_t>(cap));
  const int64_t first = std::min(n, cap - at);
  if (first > 0) std::memcpy(dst, ring + at, first);
  if (n > first) std::memcpy(dst + first, ring, n - first);
}

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
  void* get() const { return addr_; }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(addr_); }

 private:
  void Reset() {
    if (addr_ != nullptr) munmap(addr_, bytes_);
    addr_ = nullptr;
  }
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

// Unlinks a /dev/shm name when it goes out of scope, unless released.
class UnlinkGuard {
 public:
  explicit UnlinkGuard(std::string name) : name_(std::move(name)) {}
  ~UnlinkGuard() {
    if (!name_.empty()) shm_unlink(name_.c_str());
  }
  UnlinkGuard(const UnlinkGuard&) = delete;
  UnlinkGuard& operator=(const UnlinkGuard&) = delete;
  void Unlink() {
    if (!name_.empty()) shm_unlink(name_.c_str());
    name_.clear();
  }

 private:
  std::string name_;
};

Status ErrnoStatus(std::string_view what, int err) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  if (err == ENOMEM || err == ENOSPC || err == EMFILE || err == ENFILE) {
    return ResourceExhaustedError(msg);
  }
  return UnavailableError(msg);
}

Result<Mapping> MapSegment(int fd, int64_t bytes) {
  void* addr = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap", errno);
  return Mapping(addr, static_cast<size_t>(bytes));
}

// A posted Send or Recv, completed once by the progress thread.
using ShmRequest = internal::CompletionRequest;

struct PendingSend {
  std::shared_ptr<ShmRequest> request;
  uint64_t tag;
  std::span<const std::byte> data;
  Lane lane;
};

struct PostedRecv {
  std::shared_ptr<ShmRequest> request;
  uint64_t tag;
  std::span<std::byte> into;
};

// A message that arrived before its Recv was posted, buffered in full.
struct Unexpected {
  uint64_t tag = 0;
  std::vector<std::byte> bytes;
  bool complete = false;
  // Set when a Recv is posted while the bytes are still arriving.
  std::shared_ptr<ShmRequest> claimed;
  std::span<std::byte> into;
};

// Everything about one peer. Guarded by ShmTransport::mu_ except the immutable pointers.
struct Peer {
  // Immutable after construction.
  Mapping mapping;                  // the peer's segment
  SegmentHeader* header = nullptr;  // in `mapping`
  RingHeader* out = nullptr;        // this rank's ring in the peer's segment
  RingHeader* in = nullptr;         // the peer's ring in this rank's segment
  pid_t pid = 0;

  // Send side.
  std::deque<PendingSend> sends;
  bool frame_header_written = false;
  int64_t sent_bytes = 0;  // of sends.front()'s payload

  // Receive side.
  std::deque<PostedRecv> posted;
  std::deque<std::shared_ptr<Unexpected>> unexpected;
  bool receiving = false;  // a frame header was consumed; its payload is arriving
  uint64_t cur_size = 0;
  uint64_t cur_received = 0;
  std::optional<PostedRecv> cur_recv;        // payload goes to a posted Recv
  std::shared_ptr<Unexpected> cur_buffered;  // or to the unexpected buffer
  // Neither: payload is discarded (its Recv had the wrong size).

  bool closed = false;  // the peer closed normally and its ring to us is drained
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(const ShmTransportOptions& options, Mapping self, std::vector<Peer> peers)
      : options_(options),
        self_(std::move(self)),
        self_header_(self_.header()),
        peer_headers_(HeadersOf(peers)),
        peers_(std::move(peers)) {
    thread_ = std::jthread([this](std::stop_token stop) { ProgressLoop(stop); });
  }

  ~ShmTransport() override {
    {
      MutexLock lock(&mu_);
      if (error_.ok()) {
        self_header_->state.store(kClosed, std::memory_order_release);
        FailPending(AbortedError("shm transport destroyed"));
      }
    }
    for (int p = 0; p < size(); ++p) {
      if (p != rank()) Ring(peer_headers_[p]);
    }
    thread_.request_stop();
    Ring(self_header_);
    thread_.join();
  }

  static std::vector<SegmentHeader*> HeadersOf(const std::vector<Peer>& peers) {
    std::vector<SegmentHeader*> out;
    for (const Peer& p : peers) out.push_back(p.header);
    return out;
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  Clock* clock() const override { return options_.clock; }

  Result<std::shared_ptr<Request>> Send(int peer, uint64_t tag, std::span<const std::byte> data,
                                        Lane lane) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_transport");
    KC_RETURN_IF_ERROR(CheckPeer(peer));
    if (static_cast<int>(lane) >= kNumLanes) return InvalidArgumentError("shm send: bad lane");
    auto request = std::make_shared<ShmRequest>(options_.clock, "shm_transport");
    {
      MutexLock lock(&mu_);
      if (!error_.ok()) return error_;
      Peer& p = peers_[peer];
      if (p.closed) {
        request->Complete(PeerClosed(peer));
        return std::shared_ptr<Request>(request);
      }
      p.sends.push_back({request, tag, data, lane});
    }
    Ring(self_header_);
    return std::shared_ptr<Request>(request);
  }

  Result<std::shared_ptr<Request>> Recv(int peer, uint64_t tag,
                                        std::span<std::byte> data) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_transport");
    KC_RETURN_IF_ERROR(CheckPeer(peer));
    auto request = std::make_shared<ShmRequest>(options_.clock, "shm_transport");
    {
      MutexLock lock(&mu_);
      if (!error_.ok()) return error_;
      Peer& p = peers_[peer];
      if (!MatchUnexpected(p, request, tag, data)) {
        if (p.closed) {
          request->Complete(PeerClosed(peer));
        } else {
          p.posted.push_back({request, tag, data});
        }
      }
    }
    Ring(self_header_);  // a back-pressured frame may match now
    return std::shared_ptr<Request>(request);
  }

  Status status() const override {
    MutexLock lock(&mu_);
    return error_;
  }

  void Abort(Status reason) override {
    if (reason.ok()) reason = AbortedError("shm transport aborted");
    {
      MutexLock lock(&mu_);
      Fail(reason);
    }
    Ring(self_header_);
  }

 private:
  Status CheckPeer(int peer) const {
    if (peer < 0 || peer >= size() || peer == rank()) {
      return InvalidArgumentError("shm transport rank " + std::to_string(rank()) + ": bad peer " +
                                  std::to_string(peer));
    }
    return OkStatus();
  }

  Status PeerClosed(int peer) const {
    return UnavailableError("shm peer rank " + std::to_string(peer) + " closed its transport");
  }

  // Hands a buffered message with `tag` to a new Recv. False when none is buffered.
  bool MatchUnexpected(Peer& p, const std::shared_ptr<ShmRequest>& request, uint64_t tag,
                       std::span<std::byte> into) KC_REQUIRES(mu_) {
    for (auto it = p.unexpected.begin(); it != p.unexpected.end(); ++it) {
      Unexpected& u = **it;
      if (u.tag != tag || u.claimed != nullptr) continue;
      if (u.bytes.size() != into.size()) {
        request->Complete(SizeMismatch(tag, u.bytes.size(), into.size()));
      } else if (u.complete) {
        if (!into.empty()) std::memcpy(into.data(), u.bytes.data(), into.size());
        request->Complete(OkStatus());
      } else {
        u.claimed = request;
        u.into = into;
        return true;
      }
      // Completed (either way): the buffered message is consumed.
      if (u.complete) {
        unexpected_bytes_ -= static_cast<int64_t>(u.bytes.size());
        p.unexpected.erase(it);
      } else {
        u.claimed = request;  // already failed; the bytes are dropped when they finish
        u.into = {};
      }
      return true;
    }
    return false;
  }

  static Status SizeMismatch(uint64_t tag, uint64_t got, uint64_t want) {
    return InvalidArgumentError("shm recv tag=" + std::to_string(tag) + ": message has " +
                                std::to_string(got) + " bytes, receive posted " +
                                std::to_string(want));
  }

  // Records the first fatal error, fails every pending request with it and tells the peers.
  void Fail(const Status& s) KC_REQUIRES(mu_) {
    if (!error_.ok()) return;
    error_ = s;
    self_header_->state.store(kAborted, std::memory_order_release);
    FailPending(s);
    for (int p = 0; p < size(); ++p) {
      if (p != rank()) Ring(peer_headers_[p]);
    }
  }

  void FailPending(const Status& s) KC_REQUIRES(mu_) {
    for (int i = 0; i < size(); ++i) {
      if (i != rank()) FailPeer(peers_[i], s);
    }
  }

  void FailPeer(Peer& p, const Status& s) KC_REQUIRES(mu_) {
    for (auto& send : p.sends) send.request->Complete(s);
    p.sends.clear();
    for (auto& recv : p.posted) recv.request->Complete(s);
    p.posted.clear();
    if (p.cur_recv) p.cur_recv->request->Complete(s);
    p.cur_recv.reset();
    for (auto& u : p.unexpected) {
      if (u->claimed) u->claimed->Complete(s);
    }
  }

  // Moves queued send bytes into the peer's ring. True if anything moved.
  bool PumpSends(Peer& p) KC_REQUIRES(mu_) {
    const int64_t cap = options_.ring_bytes;
    std::byte* data = RingData(p.out);
    int64_t budget = options_.chunk_bytes;
    bool progressed = false;
    uint64_t tail = p.out->tail.load(std::memory_order_relaxed);  // we are the only writer
    while (!p.sends.empty() && budget > 0) {
      // Acquire: the consumer finished reading the bytes before head.
      const uint64_t head = p.out->head.load(std::memory_order_acquire);
      int64_t free_bytes = cap - static_cast<int64_t>(tail - head);
      PendingSend& s = p.sends.front();
      if (!p.frame_header_written) {
        if (free_bytes < kFrameHeaderBytes) break;
        const FrameHeader fh{.tag = s.tag,
                             .size_bytes = s.data.size(),
                             .lane = static_cast<uint32_t>(s.lane),
                             .reserved = 0};
        CopyIn(data, cap, tail, reinterpret_cast<const std::byte*>(&fh), kFrameHeaderBytes);
        tail += kFrameHeaderBytes;
        free_bytes -= kFrameHeaderBytes;
        p.frame_header_written = true;
        p.sent_bytes = 0;
        progressed = true;
      }
      const int64_t n =
          std::min({free_bytes, budget, static_cast<int64_t>(s.data.size()) - p.sent_bytes});
      if (n > 0) {
        CopyIn(data, cap, tail, s.data.data() + p.sent_bytes, n);
        tail += n;
        p.sent_bytes += n;
        budget -= n;
        progressed = true;
      }
      if (p.sent_bytes == static_cast<int64_t>(s.data.size())) {
        s.request->Complete(OkStatus());
        p.sends.pop_front();
        p.frame_header_written = false;
        p.sent_bytes = 0;
      } else if (n == 0) {
        break;  // ring full
      }
    }
    if (progressed) {
      // Release: the frame bytes are visible before the consumer sees the new tail.
      p.out->tail.store(tail, std::memory_order_release);
      Ring(p.header);
    }
    return progressed;
  }

  // Moves bytes from the peer's ring to posted Recvs or the unexpected buffer.
  bool PumpRecvs(Peer& p) KC_REQUIRES(mu_) {
    const int64_t cap = options_.ring_bytes;
    const std::byte* data = RingData(p.in);
    int64_t budget = options_.chunk_bytes;
    bool progressed = false;
    uint64_t head = p.in->head.load(std::memory_order_relaxed);  // we are the only writer
    while (budget > 0) {
      // Acquire: the producer's bytes before tail are visible.
      const uint64_t tail = p.in->tail.load(std::memory_order_acquire);
      const int64_t avail = static_cast<int64_t>(tail - head);
      if (!p.receiving) {
        if (avail < kFrameHeaderBytes) break;
        FrameHeader fh;
        CopyOut(data, cap, head, reinterpret_cast<std::byte*>(&fh), kFrameHeaderBytes);
        if (!StartFrame(p, fh, avail)) break;  // leave it in the ring for now
        head += kFrameHeaderBytes;
        progressed = true;
        continue;
      }
      const int64_t n =
          std::min({avail, budget, static_cast<int64_t>(p.cur_size - p.cur_received)});
      if (n > 0) {
        std::byte* dst = nullptr;
        if (p.cur_recv) {
          dst = p.cur_recv->into.data() + p.cur_received;
        } else if (p.cur_buffered) {
          dst = p.cur_buffered->bytes.data() + p.cur_received;
        }
        if (dst != nullptr) CopyOut(data, cap, head, dst, n);
        head += n;
        p.cur_received += n;
        budget -= n;
        progressed = true;
      }
      if (p.cur_received == p.cur_size) {
        FinishFrame(p);
      } else if (n == 0) {
        break;
      }
    }
    if (progressed) {
      // Release: our reads of the consumed bytes finish before the producer reuses them.
      p.in->head.store(head, std::memory_order_release);
      Ring(p.header);
    }
    return progressed;
  }

  // Chooses where a new frame's payload goes. False to leave the frame in the ring.
  // `avail`: bytes in the ring, the frame header included.
  bool StartFrame(Peer& p, const FrameHeader& fh, int64_t avail) KC_REQUIRES(mu_) {
    for (auto it = p.posted.begin(); it != p.posted.end(); ++it) {
      if (it->tag != fh.tag) continue;
      PostedRecv r = std::move(*it);
      p.posted.erase(it);
      if (r.into.size() != fh.size_bytes) {
        r.request->Complete(SizeMismatch(fh.tag, fh.size_bytes, r.into.size()));
      } else {
        p.cur_recv = std::move(r);
      }
      Begin(p, fh.size_bytes);
      return true;
    }
    const int64_t size = static_cast<int64_t>(fh.size_bytes);
    // Unmatched: while the producer can still make progress (the ring has room and the frame
    // is not all in it), wait for a Recv rather than buffer, so the usual case of a Recv
    // posted a little late copies once, straight into its buffer.
    if (avail - kFrameHeaderBytes < size && avail < options_.ring_bytes) return false;
    if (unexpected_bytes_ > 0 && unexpected_bytes_ + size > options_.max_unexpected_bytes) {
      return false;
    }
    auto u = std::make_shared<Unexpected>();
    u->tag = fh.tag;
    u->bytes.resize(fh.size_bytes);
    unexpected_bytes_ += size;
    p.unexpected.push_back(u);
    p.cur_buffered = std::move(u);
    Begin(p, fh.size_bytes);
    return true;
  }

  static void Begin(Peer& p, uint64_t size) {
    p.receiving = true;
    p.cur_size = size;
    p.cur_received = 0;
  }

  void FinishFrame(Peer& p) KC_REQUIRES(mu_) {
    if (p.cur_recv) p.cur_recv->request->Complete(OkStatus());
    if (p.cur_buffered) {
      Unexpected& u = *p.cur_buffered;
      u.complete = true;
      if (u.claimed != nullptr) {
        if (!u.into.empty()) std::memcpy(u.into.data(), u.bytes.data(), u.into.size());
        u.claimed->Complete(OkStatus());  // no-op if it already failed on its size
        unexpected_bytes_ -= static_cast<int64_t>(u.bytes.size());
        std::erase(p.unexpected, p.cur_buffered);
      }
    }
    p.cur_recv.reset();
    p.cur_buffered.reset();
    p.receiving = false;
    p.cur_size = p.cur_received = 0;
  }

  // Notices peers that closed or aborted. Called with mu_ held after the rings were pumped.
  void CheckPeerStates() KC_REQUIRES(mu_) {
    for (int i = 0; i < size() && error_.ok(); ++i) {
      if (i == rank()) continue;
      Peer& p = peers_[i];
      if (p.closed) continue;
      const uint32_t state = p.header->state.load(std::memory_order_acquire);
      if (state == kAborted) {
        Fail(AbortedError("shm peer rank " + std::to_string(i) + " aborted its transport"));
      } else if (state == kClosed) {
        // Acquire above: every byte the peer wrote before closing is visible. Deliver what
        // can be delivered; once nothing moves, the rest (a message cut short, or frames
        // back-pressured by max_unexpected_bytes) is lost and its Recvs fail.
        if (!PumpRecvs(p)) {
          p.closed = true;
          FailPeer(p, PeerClosed(i));
        }
      }
    }
  }

  // Fails the transport if a peer process is gone without closing.
  void CheckLiveness() KC_REQUIRES(mu_) {
    for (int i = 0; i < size() && error_.ok(); ++i) {
      if (i == rank() || peers_[i].closed) continue;
      const Peer& p = peers_[i];
      if (kill(p.pid, 0) == -1 && errno == ESRCH &&
          p.header->state.load(std::memory_order_acquire) == kOpen) {
        Fail(UnavailableError("shm peer rank " + std::to_string(i) + " (pid " +
                              std::to_string(p.pid) + ") died"));
      }
    }
  }

  // One pass over every peer. True if any bytes moved.
  bool Step() KC_REQUIRES(mu_) {
    if (!error_.ok()) return false;
    bool progressed = false;
    for (int i = 0; i < size(); ++i) {
      if (i == rank()) continue;
      progressed |= PumpSends(peers_[i]);
      progressed |= PumpRecvs(peers_[i]);
    }
    CheckPeerStates();
    return progressed;
  }

  void ProgressLoop(std::stop_token stop) {
    int idle = 0;
    auto next_liveness = std::chrono::steady_clock::now() + kLivenessPeriod;
    while (!stop.stop_requested()) {
      // Read before the pass: any event after it changes the word, so the futex wait below
      // returns at once instead of missing it.
      const uint32_t seq = self_header_->doorbell.load(std::memory_order_seq_cst);
      bool progressed;
      {
        MutexLock lock(&mu_);
        progressed = Step();
        if (std::chrono::steady_clock::now() >= next_liveness) {
          CheckLiveness();
          next_liveness = std::chrono::steady_clock::now() + kLivenessPeriod;
        }
      }
      if (progressed) {
        idle = 0;
        continue;
      }
      if (++idle < options_.spin_iterations) {
        // Yield now and then: with more runnable threads than cores (ranks as threads, the
        // callers waiting to post their next request) a pure spin would hold the core.
        if (idle % 16 == 0) {
          std::this_thread::yield();
        } else {
          KC_SHM_CPU_RELAX();
        }
        continue;
      }
      // Sleep until rung, or for one liveness period.
      self_header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (self_header_->doorbell.load(std::memory_order_seq_cst) == seq && !stop.stop_requested()) {
        const timespec timeout{.tv_sec = 0,
                               .tv_nsec = std::chrono::nanoseconds(kLivenessPeriod).count()};
        syscall(SYS_futex, FutexWord(&self_header_->doorbell), FUTEX_WAIT, seq, &timeout, nullptr,
                0);
      }
      self_header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      idle = 0;
    }
  }

  // Immutable after construction.
  const ShmTransportOptions options_;
  const Mapping self_;                // this rank's segment (its peers' rings into it)
  SegmentHeader* const self_header_;  // in self_
  // Each peer's segment header (nullptr for this rank), mapped by peers_[i].mapping, which
  // lives as long as this object.
  const std::vector<SegmentHeader*> peer_headers_;

  mutable Mutex mu_;
  // Guarded by mu_ (the peers' queues and cursors too; the vector itself is fixed).
  // Indexed by rank; peers_[rank()] is unused. Its Mappings and pointers never change.
  std::vector<Peer> peers_ KC_GUARDED_BY(mu_);
  Status error_ KC_GUARDED_BY(mu_);
  int64_t unexpected_bytes_ KC_GUARDED_BY(mu_) = 0;

  std::jthread thread_;  // last: joined before the state it uses goes
};

std::string SegmentPrefix(std::string_view group) {
  std::string out = "/kc-shm-";
  for (char c : group.substr(0, 96)) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out += plain ? c : '_';
  }
  return out + "-";
}

std::string RandomHex() {
  std::random_device rd;
  const uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Key(const ShmTransportOptions& o, std::string_view what, int rank) {
  return "kc/shm/" + o.group + "/" + std::string(what) + "/" + std::to_string(rank);
}

Result<Peer> MapPeer(const ShmTransportOptions& o, int peer, const std::string& name) {
  hal::Fd fd(shm_open(name.c_str(), O_RDWR, 0));
  if (!fd.valid())
    return ErrnoStatus("shm_open " + name + " of rank " + std::to_string(peer), errno);
  struct stat st;
  const int64_t bytes = SegmentBytes(o.size, o.ring_bytes);
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat " + name, errno);
  if (st.st_size != bytes) {
    return DataLossError("shm segment " + name + " has " + std::to_string(st.st_size) +
                         " bytes, expected " + std::to_string(bytes));
  }
  KC_ASSIGN_OR_RETURN(Mapping m, MapSegment(fd.get(), bytes));
  SegmentHeader* h = m.header();
  if (h->magic != kMagic || h->rank != peer || h->size != o.size ||
      h->ring_bytes != static_cast<uint64_t>(o.ring_bytes)) {
    return DataLossError("shm segment " + name + " does not match rank " + std::to_string(peer) +
                         " of this group");
  }
  Peer p;
  p.header = h;
  p.pid = h->pid;
  p.out = RingAt(m.get(), o.rank, o.ring_bytes);
  p.mapping = std::move(m);
  return p;
}

}  // namespace

Result<std::unique_ptr<Transport>> CreateShmTransport(const ShmTransportOptions& o) {
  KC_LAYER_ENTRY(Layer::kComm, "shm_transport");
  if (o.store == nullptr || o.clock == nullptr || o.group.empty() || o.size < 1 || o.rank < 0 ||
      o.rank >= o.size || o.ring_bytes < 4096 || o.ring_bytes % 64 != 0 || o.chunk_bytes < 1 ||
      o.spin_iterations < 0 || o.max_unexpected_bytes < 0) {
    return InvalidArgumentError("shm transport: bad options for group " + o.group + " rank " +
                                std::to_string(o.rank) + " of " + std::to_string(o.size));
  }
  const TimePoint deadline = o.store->clock()->Now() + o.connect_timeout;
  const int64_t bytes = SegmentBytes(o.size, o.ring_bytes);

  // 1. Create and initialise this rank's segment under an unguessable name.
  const std::string name =
      SegmentPrefix(o.group) + "r" + std::to_string(o.rank) + "-" + RandomHex();
  hal::Fd fd(shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (!fd.valid()) return ErrnoStatus("shm_open " + name, errno);
  UnlinkGuard unlink(name);
  if (ftruncate(fd.get(), bytes) != 0) return ErrnoStatus("ftruncate " + name, errno);
  KC_ASSIGN_OR_RETURN(Mapping self, MapSegment(fd.get(), bytes));
  fd.Reset();
  SegmentHeader* h = new (self.get()) SegmentHeader{};
  h->magic = kMagic;
  h->rank = o.rank;
  h->size = o.size;
  h->pid = getpid();
  h->ring_bytes = static_cast<uint64_t>(o.ring_bytes);
  for (int s = 0; s < o.size; ++s) new (RingAt(self.get(), s, o.ring_bytes)) RingHeader{};

  // 2. Publish its name, then map every peer's.
  KC_RETURN_IF_ERROR(o.store->Set(Key(o, "seg", o.rank), name));
  std::vector<Peer> peers(static_cast<size_t>(o.size));
  for (int p = 0; p < o.size; ++p) {
    if (p == o.rank) continue;
    KC_ASSIGN_OR_RETURN(std::string peer_name, o.store->Get(Key(o, "seg", p), deadline));
    KC_ASSIGN_OR_RETURN(peers[p], MapPeer(o, p, peer_name));
    peers[p].in = RingAt(self.get(), p, o.ring_bytes);
  }

  // 3. Once every rank has mapped every segment, nobody needs the names any more.
  KC_RETURN_IF_ERROR(o.store->Set(Key(o, "mapped", o.rank), "1"));
  std::vector<std::string> mapped;
  for (int p = 0; p < o.size; ++p) mapped.push_back(Key(o, "mapped", p));
  KC_RETURN_IF_ERROR(o.store->Wait(mapped, deadline));
  unlink.Unlink();
  return std::unique_ptr<Transport>(
      std::make_unique<ShmTransport>(o, std::move(self), std::move(peers)));
}

}  // namespace kc::comm
