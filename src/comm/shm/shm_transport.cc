// The shared-memory transport: one segment per rank holding the rings its peers write into,
// and one progress thread per endpoint moving bytes between posted requests and the rings.
#include "comm/shm/shm_transport.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <new>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/layer_guard.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "comm/internal/completion_request.h"
#include "comm/internal/shm_segment.h"

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

constexpr uint64_t kMagic = 0x4b43'53484d'0002ull;  // "KC" "SHM" v2: a ring per lane
constexpr int64_t kSegmentHeaderBytes = 256;
constexpr int64_t kRingHeaderBytes = 128;
constexpr int64_t kFrameHeaderBytes = 24;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(50);
// Starvation guard: after this many consecutive steps served by strict lane priority, one
// step serves the lanes lowest first, so the lower lanes together get at least 1/17 of the
// pieces while a higher lane keeps moving.
constexpr int kStrictStepsPerGuardStep = 16;

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
  uint32_t lanes;                              // kNumLanes
  uint64_t ring_bytes[kNumLanes];              // per lane, indexed by the Lane's value
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

// Bytes of one sender's rings (all lanes, headers included) in a segment.
int64_t SenderStride(const ShmLaneBytes& ring_bytes) {
  int64_t n = 0;
  for (int64_t b : ring_bytes.bytes) n += kRingHeaderBytes + b;
  return n;
}

int64_t SegmentBytes(int size, const ShmLaneBytes& ring_bytes) {
  return kSegmentHeaderBytes + int64_t{size} * SenderStride(ring_bytes);
}

// The ring carrying `lane` from `sender` in a segment: senders in rank order, each with its
// lanes highest priority first.
RingHeader* RingAt(void* base, int sender, int lane, const ShmLaneBytes& ring_bytes) {
  int64_t at = kSegmentHeaderBytes + int64_t{sender} * SenderStride(ring_bytes);
  for (int l = 0; l < lane; ++l) at += kRingHeaderBytes + ring_bytes.bytes[l];
  return reinterpret_cast<RingHeader*>(static_cast<std::byte*>(base) + at);
}
std::byte* RingData(RingHeader* ring) {
  return reinterpret_cast<std::byte*>(ring) + kRingHeaderBytes;
}

// Wakes the segment owner's progress thread. The seq_cst bump followed by the seq_cst load of
// sleepers pairs with the sleeper's seq_cst increment of sleepers followed by its seq_cst
// load of doorbell: either we see the sleeper, or it sees the new doorbell value.
void Ring(SegmentHeader* h) {
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) != 0) internal::FutexWakeAll(&h->doorbell);
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

using internal::ErrnoStatus;
using internal::Mapping;

// A posted Send or Recv, completed once by the progress thread.
using ShmRequest = internal::CompletionRequest;

// A Send or Recv as the caller posted it, before the progress thread takes it.
struct PostedOp {
  std::shared_ptr<ShmRequest> request;
  int peer = 0;
  uint64_t tag = 0;
  bool is_send = false;
  Lane lane = Lane::kGradient;           // sends only
  std::span<const std::byte> send_data;  // is_send
  std::span<std::byte> recv_into;        // !is_send
};

struct PendingSend {
  std::shared_ptr<ShmRequest> request;
  uint64_t tag;
  std::span<const std::byte> data;
};

struct PostedRecv {
  std::shared_ptr<ShmRequest> request;
  uint64_t tag;
  std::span<std::byte> into;
};

// A message that arrived before its Recv was posted, buffered in full.
struct Unexpected {
  uint64_t tag = 0;
  int lane = 0;  // whose max_unexpected_bytes it counts against
  uint64_t size = 0;
  std::unique_ptr<std::byte[]> bytes;  // size bytes, not zeroed first
  bool complete = false;
  // Set when a Recv is posted while the bytes are still arriving.
  std::shared_ptr<ShmRequest> claimed;
  std::span<std::byte> into;
};

// The bytes of a buffered message on their way to the Recv that took it, copied one piece
// at a time on the message's lane, so a large copy never holds up a higher lane.
struct CopyJob {
  std::shared_ptr<Unexpected> from;  // complete
  std::span<std::byte> into;         // from->size bytes
  std::shared_ptr<ShmRequest> request;
  int64_t done_bytes = 0;
};

// One lane of the stream to a peer.
struct SendLane {
  RingHeader* ring = nullptr;  // in the peer's segment; immutable after construction
  std::deque<PendingSend> queue;
  bool frame_header_written = false;
  int64_t sent_bytes = 0;  // of queue.front()'s payload
};

// One lane of the stream from a peer.
struct RecvLane {
  RingHeader* ring = nullptr;  // in this rank's segment; immutable after construction
  bool receiving = false;      // a frame header was consumed; its payload is arriving
  uint64_t cur_size = 0;
  uint64_t cur_received = 0;
  std::optional<PostedRecv> cur_recv;        // payload goes to a posted Recv
  std::shared_ptr<Unexpected> cur_buffered;  // or to the unexpected buffer
  // Neither: payload is discarded (its Recv had the wrong size).
};

// Everything about one peer. Guarded by ShmTransport::mu_ except the immutable pointers.
struct Peer {
  // Immutable after construction.
  Mapping mapping;                  // the peer's segment
  SegmentHeader* header = nullptr;  // in `mapping`
  pid_t pid = 0;

  std::array<SendLane, kNumLanes> out;  // indexed by the Lane's value
  std::array<RecvLane, kNumLanes> in;

  // Receive side, shared by the lanes: a Recv names no lane.
  std::deque<PostedRecv> posted;
  std::deque<std::shared_ptr<Unexpected>> unexpected;

  bool closed = false;  // the peer closed normally and its rings to us are drained
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(const ShmTransportOptions& options, Mapping self, std::vector<Peer> peers)
      : options_(options),
        self_(std::move(self)),
        self_header_(self_.as<SegmentHeader>()),
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
    KC_RETURN_IF_ERROR(Post({.request = request,
                             .peer = peer,
                             .tag = tag,
                             .is_send = true,
                             .lane = lane,
                             .send_data = data}));
    return std::shared_ptr<Request>(request);
  }

  Result<std::shared_ptr<Request>> Recv(int peer, uint64_t tag,
                                        std::span<std::byte> data) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_transport");
    KC_RETURN_IF_ERROR(CheckPeer(peer));
    auto request = std::make_shared<ShmRequest>(options_.clock, "shm_transport");
    KC_RETURN_IF_ERROR(
        Post({.request = request, .peer = peer, .tag = tag, .is_send = false, .recv_into = data}));
    return std::shared_ptr<Request>(request);
  }

  Status status() const override {
    MutexLock lock(&post_mu_);
    return post_error_;
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

  // Hands `op` to the progress thread. Only post_mu_ is taken, never mu_, so posting does
  // not wait for a piece being copied (nor lose the lock to the progress thread's loop).
  Status Post(PostedOp op) {
    {
      MutexLock lock(&post_mu_);
      if (!post_error_.ok()) return post_error_;
      posted_ops_.push_back(std::move(op));
    }
    Ring(self_header_);
    return OkStatus();
  }

  // Moves the ops posted since the last call to their peers, in posting order.
  void TakePosted() KC_REQUIRES(mu_) {
    std::vector<PostedOp> ops;
    {
      MutexLock lock(&post_mu_);
      ops.swap(posted_ops_);
    }
    for (PostedOp& op : ops) {
      Peer& p = peers_[op.peer];
      if (op.is_send) {
        if (p.closed) {
          op.request->Complete(PeerClosed(op.peer));
        } else {
          p.out[static_cast<size_t>(op.lane)].queue.push_back({op.request, op.tag, op.send_data});
        }
      } else if (!MatchUnexpected(p, op.request, op.tag, op.recv_into)) {
        // A closed peer's buffered messages can still be received; nothing else will come.
        if (p.closed) {
          op.request->Complete(PeerClosed(op.peer));
        } else {
          p.posted.push_back({op.request, op.tag, op.recv_into});
        }
      }
    }
  }

  // Hands a buffered message with `tag` to a new Recv. False when none is buffered.
  bool MatchUnexpected(Peer& p, const std::shared_ptr<ShmRequest>& request, uint64_t tag,
                       std::span<std::byte> into) KC_REQUIRES(mu_) {
    for (auto it = p.unexpected.begin(); it != p.unexpected.end(); ++it) {
      Unexpected& u = **it;
      if (u.tag != tag || u.claimed != nullptr) continue;
      if (u.size != into.size()) {
        request->Complete(SizeMismatch(tag, u.size, into.size()));
        if (u.complete) {
          unexpected_bytes_[u.lane] -= static_cast<int64_t>(u.size);
          p.unexpected.erase(it);
        } else {
          u.claimed = request;  // already failed; the bytes are dropped when they finish
          u.into = {};
        }
      } else if (u.complete) {
        copies_[u.lane].push_back({.from = *it, .into = into, .request = request});
        p.unexpected.erase(it);
      } else {
        u.claimed = request;
        u.into = into;
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

  // Fails every request, queued or not yet taken; later posts return `s`.
  void FailPending(const Status& s) KC_REQUIRES(mu_) {
    std::vector<PostedOp> ops;
    {
      MutexLock lock(&post_mu_);
      post_error_ = s;
      ops.swap(posted_ops_);
    }
    for (PostedOp& op : ops) op.request->Complete(s);
    for (std::deque<CopyJob>& jobs : copies_) {
      for (CopyJob& j : jobs) j.request->Complete(s);
      jobs.clear();
    }
    for (int i = 0; i < size(); ++i) {
      if (i != rank()) FailPeer(peers_[i], s);
    }
  }

  void FailPeer(Peer& p, const Status& s) KC_REQUIRES(mu_) {
    for (SendLane& out : p.out) {
      for (auto& send : out.queue) send.request->Complete(s);
      out.queue.clear();
    }
    for (auto& recv : p.posted) recv.request->Complete(s);
    p.posted.clear();
    for (RecvLane& in : p.in) {
      if (in.cur_recv) in.cur_recv->request->Complete(s);
      in.cur_recv.reset();
    }
    for (auto& u : p.unexpected) {
      if (u->claimed) u->claimed->Complete(s);
    }
  }

  // Moves up to one piece (chunk_bytes of the lane) of queued send bytes into the peer's
  // ring of `lane`. True if anything moved.
  bool PumpSends(Peer& p, int lane) KC_REQUIRES(mu_) {
    SendLane& out = p.out[lane];
    if (out.queue.empty()) return false;
    const int64_t cap = options_.ring_bytes.bytes[lane];
    std::byte* data = RingData(out.ring);
    int64_t budget = options_.chunk_bytes.bytes[lane];
    bool progressed = false;
    uint64_t tail = out.ring->tail.load(std::memory_order_relaxed);  // we are the only writer
    while (!out.queue.empty() && budget > 0) {
      // Acquire: the consumer finished reading the bytes before head.
      const uint64_t head = out.ring->head.load(std::memory_order_acquire);
      int64_t free_bytes = cap - static_cast<int64_t>(tail - head);
      PendingSend& s = out.queue.front();
      if (!out.frame_header_written) {
        if (free_bytes < kFrameHeaderBytes) break;
        const FrameHeader fh{.tag = s.tag,
                             .size_bytes = s.data.size(),
                             .lane = static_cast<uint32_t>(lane),
                             .reserved = 0};
        CopyIn(data, cap, tail, reinterpret_cast<const std::byte*>(&fh), kFrameHeaderBytes);
        tail += kFrameHeaderBytes;
        free_bytes -= kFrameHeaderBytes;
        out.frame_header_written = true;
        out.sent_bytes = 0;
        progressed = true;
      }
      const int64_t n =
          std::min({free_bytes, budget, static_cast<int64_t>(s.data.size()) - out.sent_bytes});
      if (n > 0) {
        CopyIn(data, cap, tail, s.data.data() + out.sent_bytes, n);
        tail += n;
        out.sent_bytes += n;
        budget -= n;
        progressed = true;
      }
      if (out.sent_bytes == static_cast<int64_t>(s.data.size())) {
        s.request->Complete(OkStatus());
        out.queue.pop_front();
        out.frame_header_written = false;
        out.sent_bytes = 0;
      } else if (n == 0) {
        break;  // ring full
      }
    }
    if (progressed) {
      // Release: the frame bytes are visible before the consumer sees the new tail.
      out.ring->tail.store(tail, std::memory_order_release);
      Ring(p.header);
    }
    return progressed;
  }

  // Moves up to one piece of the peer's ring of `lane` to posted Recvs or the unexpected
  // buffer.
  bool PumpRecvs(Peer& p, int lane) KC_REQUIRES(mu_) {
    RecvLane& in = p.in[lane];
    const int64_t cap = options_.ring_bytes.bytes[lane];
    const std::byte* data = RingData(in.ring);
    int64_t budget = options_.chunk_bytes.bytes[lane];
    bool progressed = false;
    uint64_t head = in.ring->head.load(std::memory_order_relaxed);  // we are the only writer
    while (budget > 0) {
      // Acquire: the producer's bytes before tail are visible.
      const uint64_t tail = in.ring->tail.load(std::memory_order_acquire);
      const int64_t avail = static_cast<int64_t>(tail - head);
      if (!in.receiving) {
        if (avail < kFrameHeaderBytes) break;
        FrameHeader fh;
        CopyOut(data, cap, head, reinterpret_cast<std::byte*>(&fh), kFrameHeaderBytes);
        if (!StartFrame(p, lane, fh, avail)) break;  // leave it in the ring for now
        head += kFrameHeaderBytes;
        progressed = true;
        continue;
      }
      const int64_t n =
          std::min({avail, budget, static_cast<int64_t>(in.cur_size - in.cur_received)});
      if (n > 0) {
        std::byte* dst = nullptr;
        if (in.cur_recv) {
          dst = in.cur_recv->into.data() + in.cur_received;
        } else if (in.cur_buffered) {
          dst = in.cur_buffered->bytes.get() + in.cur_received;
        }
        if (dst != nullptr) CopyOut(data, cap, head, dst, n);
        head += n;
        in.cur_received += n;
        budget -= n;
        progressed = true;
      }
      if (in.cur_received == in.cur_size) {
        FinishFrame(p, in);
      } else if (n == 0) {
        break;
      }
    }
    if (progressed) {
      // Release: our reads of the consumed bytes finish before the producer reuses them.
      in.ring->head.store(head, std::memory_order_release);
      Ring(p.header);
    }
    return progressed;
  }

  // Chooses where a new frame's payload goes. False to leave the frame in the ring.
  // `avail`: bytes in the lane's ring, the frame header included.
  bool StartFrame(Peer& p, int lane, const FrameHeader& fh, int64_t avail) KC_REQUIRES(mu_) {
    RecvLane& in = p.in[lane];
    for (auto it = p.posted.begin(); it != p.posted.end(); ++it) {
      if (it->tag != fh.tag) continue;
      PostedRecv r = std::move(*it);
      p.posted.erase(it);
      if (r.into.size() != fh.size_bytes) {
        r.request->Complete(SizeMismatch(fh.tag, fh.size_bytes, r.into.size()));
      } else {
        in.cur_recv = std::move(r);
      }
      Begin(in, fh.size_bytes);
      return true;
    }
    const int64_t size = static_cast<int64_t>(fh.size_bytes);
    // Unmatched: while the producer can still make progress (the ring has room and the frame
    // is not all in it), wait for a Recv rather than buffer, so the usual case of a Recv
    // posted a little late copies once, straight into its buffer.
    if (avail - kFrameHeaderBytes < size && avail < options_.ring_bytes.bytes[lane]) return false;
    if (unexpected_bytes_[lane] > 0 &&
        unexpected_bytes_[lane] + size > options_.max_unexpected_bytes.bytes[lane]) {
      return false;
    }
    auto u = std::make_shared<Unexpected>();
    u->tag = fh.tag;
    u->lane = lane;
    u->size = fh.size_bytes;
    u->bytes = std::make_unique_for_overwrite<std::byte[]>(fh.size_bytes);
    unexpected_bytes_[lane] += size;
    p.unexpected.push_back(u);
    in.cur_buffered = std::move(u);
    Begin(in, fh.size_bytes);
    return true;
  }

  static void Begin(RecvLane& in, uint64_t size) {
    in.receiving = true;
    in.cur_size = size;
    in.cur_received = 0;
  }

  void FinishFrame(Peer& p, RecvLane& in) KC_REQUIRES(mu_) {
    if (in.cur_recv) in.cur_recv->request->Complete(OkStatus());
    if (in.cur_buffered) {
      Unexpected& u = *in.cur_buffered;
      u.complete = true;
      if (u.claimed != nullptr) {
        if (u.into.empty()) {
          u.claimed->Complete(OkStatus());  // no-op if it already failed on its size
          unexpected_bytes_[u.lane] -= static_cast<int64_t>(u.size);
        } else {
          copies_[u.lane].push_back(
              {.from = in.cur_buffered, .into = u.into, .request = u.claimed});
        }
        std::erase(p.unexpected, in.cur_buffered);
      }
    }
    in.cur_recv.reset();
    in.cur_buffered.reset();
    in.receiving = false;
    in.cur_size = in.cur_received = 0;
  }

  // Moves one piece of the oldest copy of a buffered message on `lane`. True if it did.
  bool PumpCopies(int lane) KC_REQUIRES(mu_) {
    std::deque<CopyJob>& jobs = copies_[lane];
    if (jobs.empty()) return false;
    CopyJob& j = jobs.front();
    const int64_t n = std::min(options_.chunk_bytes.bytes[lane],
                               static_cast<int64_t>(j.into.size()) - j.done_bytes);
    if (n > 0) std::memcpy(j.into.data() + j.done_bytes, j.from->bytes.get() + j.done_bytes, n);
    j.done_bytes += n;
    if (j.done_bytes == static_cast<int64_t>(j.into.size())) {
      j.request->Complete(OkStatus());
      unexpected_bytes_[lane] -= static_cast<int64_t>(j.from->size);
      jobs.pop_front();
    }
    return true;
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
        // can be delivered; once nothing moves on any lane, the rest (a message cut short,
        // or frames back-pressured by max_unexpected_bytes) is lost and its Recvs fail.
        bool moved = false;
        for (int lane = 0; lane < kNumLanes; ++lane) moved |= PumpRecvs(p, lane);
        if (!moved) {
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
      if (internal::ProcessDead(p.pid) &&
          p.header->state.load(std::memory_order_acquire) == kOpen) {
        Fail(UnavailableError("shm peer rank " + std::to_string(i) + " (pid " +
                              std::to_string(p.pid) + ") died"));
      }
    }
  }

  // One step: takes newly posted requests, then serves the highest lane on which anything
  // can move (sends or receives, one piece per peer) and stops there, so mu_ is released
  // and the priorities re-checked after every piece. Every kStrictStepsPerGuardStep steps
  // the lanes are tried lowest first instead (starvation guard). Returns the lane served,
  // or -1 when nothing moved.
  int Step() KC_REQUIRES(mu_) {
    if (!error_.ok()) return -1;
    TakePosted();
    const bool guard = strict_steps_ >= kStrictStepsPerGuardStep;
    bool progressed = false;
    int served = 0;
    for (int i = 0; i < kNumLanes && !progressed; ++i) {
      served = guard ? kNumLanes - 1 - i : i;
      progressed = PumpCopies(served);
      for (int k = 0; k < size(); ++k) {
        // Rotate the first peer so that no peer is always served first.
        const int peer = (next_peer_ + k) % size();
        if (peer == rank()) continue;
        progressed |= PumpSends(peers_[peer], served);
        progressed |= PumpRecvs(peers_[peer], served);
      }
    }
    next_peer_ = (next_peer_ + 1) % size();
    if (progressed) {
      // A step that served the lowest lane owes the lower lanes nothing.
      strict_steps_ = (guard || served == kNumLanes - 1) ? 0 : strict_steps_ + 1;
    }
    CheckPeerStates();
    return progressed ? served : -1;
  }

  void ProgressLoop(std::stop_token stop) {
    int idle = 0;
    auto next_liveness = std::chrono::steady_clock::now() + kLivenessPeriod;
    while (!stop.stop_requested()) {
      // Read before the step: any event after it changes the word, so the futex wait below
      // returns at once instead of missing it.
      const uint32_t seq = self_header_->doorbell.load(std::memory_order_seq_cst);
      int served;
      {
        MutexLock lock(&mu_);
        served = Step();
        if (std::chrono::steady_clock::now() >= next_liveness) {
          CheckLiveness();
          next_liveness = std::chrono::steady_clock::now() + kLivenessPeriod;
        }
      }
      if (served >= 0) {
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
        internal::FutexWait(&self_header_->doorbell, seq,
                            std::chrono::nanoseconds(kLivenessPeriod).count());
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

  // Held by the progress thread for one step at a time; callers never take it to post.
  // Lock order: mu_ before post_mu_.
  mutable Mutex mu_;
  // Guarded by mu_ (the peers' queues and cursors too; the vector itself is fixed).
  // Indexed by rank; peers_[rank()] is unused. Its Mappings and pointers never change.
  std::vector<Peer> peers_ KC_GUARDED_BY(mu_);
  Status error_ KC_GUARDED_BY(mu_);
  std::array<int64_t, kNumLanes> unexpected_bytes_ KC_GUARDED_BY(mu_) = {};
  int strict_steps_ KC_GUARDED_BY(mu_) = 0;  // steps since the lower lanes were last served
  int next_peer_ KC_GUARDED_BY(mu_) = 0;
  // Copies out of unexpected buffers, per lane, oldest first.
  std::array<std::deque<CopyJob>, kNumLanes> copies_ KC_GUARDED_BY(mu_);

  // Requests posted but not yet taken by the progress thread.
  mutable Mutex post_mu_;
  std::vector<PostedOp> posted_ops_ KC_GUARDED_BY(post_mu_);
  Status post_error_ KC_GUARDED_BY(post_mu_);  // error_ (or the destroyed status), for posters

  std::jthread thread_;  // last: joined before the state it uses goes
};

std::string SegmentPrefix(std::string_view group) {
  return internal::SegmentPrefix("/kc-shm-", group);
}

std::string Key(const ShmTransportOptions& o, std::string_view what, int rank) {
  return "kc/shm/" + o.group + "/" + std::string(what) + "/" + std::to_string(rank);
}

Result<Peer> MapPeer(const ShmTransportOptions& o, int peer, const std::string& name) {
  KC_ASSIGN_OR_RETURN(Mapping m,
                      internal::MapExisting(name, peer, SegmentBytes(o.size, o.ring_bytes)));
  SegmentHeader* h = m.as<SegmentHeader>();
  bool same_rings = h->lanes == kNumLanes;
  for (int l = 0; l < kNumLanes && same_rings; ++l) {
    same_rings = h->ring_bytes[l] == static_cast<uint64_t>(o.ring_bytes.bytes[l]);
  }
  if (h->magic != kMagic || h->rank != peer || h->size != o.size || !same_rings) {
    return DataLossError("shm segment " + name + " does not match rank " + std::to_string(peer) +
                         " of this group");
  }
  Peer p;
  p.header = h;
  p.pid = h->pid;
  for (int l = 0; l < kNumLanes; ++l) p.out[l].ring = RingAt(m.get(), o.rank, l, o.ring_bytes);
  p.mapping = std::move(m);
  return p;
}

}  // namespace

Result<std::unique_ptr<Transport>> CreateShmTransport(const ShmTransportOptions& o) {
  KC_LAYER_ENTRY(Layer::kComm, "shm_transport");
  bool lanes_ok = true;
  for (int l = 0; l < kNumLanes; ++l) {
    lanes_ok = lanes_ok && o.ring_bytes.bytes[l] >= 4096 && o.ring_bytes.bytes[l] % 64 == 0 &&
               o.ring_bytes.bytes[l] <= (int64_t{1} << 40) && o.chunk_bytes.bytes[l] >= 1 &&
               o.max_unexpected_bytes.bytes[l] >= 0;
  }
  if (o.store == nullptr || o.clock == nullptr || o.group.empty() || o.size < 1 || o.rank < 0 ||
      o.rank >= o.size || !lanes_ok || o.spin_iterations < 0) {
    return InvalidArgumentError("shm transport: bad options for group " + o.group + " rank " +
                                std::to_string(o.rank) + " of " + std::to_string(o.size));
  }
  const TimePoint deadline = o.store->clock()->Now() + o.connect_timeout;
  const int64_t bytes = SegmentBytes(o.size, o.ring_bytes);

  // 1. Create and initialise this rank's segment under an unguessable name.
  const std::string name =
      SegmentPrefix(o.group) + "r" + std::to_string(o.rank) + "-" + internal::RandomHex();
  KC_ASSIGN_OR_RETURN(internal::NewSegment seg, internal::CreateSegment(name, bytes));
  Mapping self = std::move(seg.mapping);
  SegmentHeader* h = new (self.get()) SegmentHeader{};
  h->magic = kMagic;
  h->rank = o.rank;
  h->size = o.size;
  h->pid = getpid();
  h->lanes = kNumLanes;
  for (int l = 0; l < kNumLanes; ++l)
    h->ring_bytes[l] = static_cast<uint64_t>(o.ring_bytes.bytes[l]);
  for (int s = 0; s < o.size; ++s) {
    for (int l = 0; l < kNumLanes; ++l) new (RingAt(self.get(), s, l, o.ring_bytes)) RingHeader{};
  }

  // 2. Publish its name, then map every peer's.
  KC_RETURN_IF_ERROR(o.store->Set(Key(o, "seg", o.rank), name));
  std::vector<Peer> peers(static_cast<size_t>(o.size));
  for (int p = 0; p < o.size; ++p) {
    if (p == o.rank) continue;
    KC_ASSIGN_OR_RETURN(std::string peer_name, o.store->Get(Key(o, "seg", p), deadline));
    KC_ASSIGN_OR_RETURN(peers[p], MapPeer(o, p, peer_name));
    for (int l = 0; l < kNumLanes; ++l)
      peers[p].in[l].ring = RingAt(self.get(), p, l, o.ring_bytes);
  }

  // 3. Once every rank has mapped every segment, nobody needs the names any more.
  KC_RETURN_IF_ERROR(o.store->Set(Key(o, "mapped", o.rank), "1"));
  std::vector<std::string> mapped;
  for (int p = 0; p < o.size; ++p) mapped.push_back(Key(o, "mapped", p));
  KC_RETURN_IF_ERROR(o.store->Wait(mapped, deadline));
  seg.unlink->Unlink();
  return std::unique_ptr<Transport>(
      std::make_unique<ShmTransport>(o, std::move(self), std::move(peers)));
}

}  // namespace kc::comm
