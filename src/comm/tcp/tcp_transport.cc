#include "comm/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/layer_guard.h"
#include "base/mutex.h"
#include "base/notification.h"
#include "comm/internal/completion_request.h"
#include "hal/fd.h"
#include "hal/socket.h"

namespace kc::comm {
namespace {

using hal::Fd;

constexpr uint32_t kHelloMagic = 0x3150434b;  // "KCP1"
constexpr uint32_t kFrameMagic = 0x3146434b;  // "KCF1"
constexpr uint32_t kCloseMagic = 0x3143434b;  // "KCC1"
constexpr uint32_t kVersion = 1;
constexpr size_t kMaxGroupBytes = 1024;
constexpr int kMaxConnectionsPerPeer = 64;
constexpr size_t kHelloFixedBytes = 28;  // up to and including group_bytes
constexpr size_t kFrameHeaderBytes = 48;
constexpr int kSocketBufferBytes = 4 * 1024 * 1024;
// How long an accepted connection may take to send its hello.
constexpr Duration kHelloTimeout = std::chrono::seconds(5);

std::string Errno() { return std::strerror(errno); }

// Milliseconds from now to `deadline` for poll(), rounded up; 0 once it has passed.
int PollMs(TimePoint deadline) {
  const TimePoint now = std::chrono::steady_clock::now();
  if (deadline <= now) return 0;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1 << 30));
}

void PutU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void PutU64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint32_t GetU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::vector<std::byte> EncodeHello(const std::string& group, int rank, int size, int connection,
                                   int connections) {
  std::vector<std::byte> out(kHelloFixedBytes + group.size());
  PutU32(&out[0], kHelloMagic);
  PutU32(&out[4], kVersion);
  PutU32(&out[8], static_cast<uint32_t>(rank));
  PutU32(&out[12], static_cast<uint32_t>(size));
  PutU32(&out[16], static_cast<uint32_t>(connection));
  PutU32(&out[20], static_cast<uint32_t>(connections));
  PutU32(&out[24], static_cast<uint32_t>(group.size()));
  std::memcpy(out.data() + kHelloFixedBytes, group.data(), group.size());
  return out;
}

// One chunk's header on the wire (see comm/doc/tcp_protocol.md).
struct FrameHeader {
  uint8_t lane = 0;
  uint64_t tag = 0;
  uint64_t seq = 0;
  uint64_t message_bytes = 0;
  uint64_t offset = 0;
  uint32_t chunk_bytes = 0;
};

void EncodeFrame(const FrameHeader& h, std::byte* p) {
  PutU32(p, kFrameMagic);
  PutU32(p + 4, h.lane);
  PutU64(p + 8, h.tag);
  PutU64(p + 16, h.seq);
  PutU64(p + 24, h.message_bytes);
  PutU64(p + 32, h.offset);
  PutU32(p + 40, h.chunk_bytes);
  PutU32(p + 44, 0);
}

// The close frame: the close magic, then zeros.
void EncodeClose(std::byte* p) {
  std::memset(p, 0, kFrameHeaderBytes);
  PutU32(p, kCloseMagic);
}

bool IsCloseFrame(const std::byte* p) {
  if (GetU32(p) != kCloseMagic) return false;
  return std::all_of(p + 4, p + kFrameHeaderBytes, [](std::byte b) { return b == std::byte{0}; });
}

// A data frame's header; nullopt for a malformed one.
std::optional<FrameHeader> DecodeFrame(const std::byte* p) {
  if (GetU32(p) != kFrameMagic || GetU32(p + 4) >= kNumLanes || GetU32(p + 44) != 0) {
    return std::nullopt;
  }
  FrameHeader h;
  h.lane = static_cast<uint8_t>(GetU32(p + 4));
  h.tag = GetU64(p + 8);
  h.seq = GetU64(p + 16);
  h.message_bytes = GetU64(p + 24);
  h.offset = GetU64(p + 32);
  h.chunk_bytes = GetU32(p + 40);
  if (h.offset > h.message_bytes || h.chunk_bytes > h.message_bytes - h.offset) {
    return std::nullopt;
  }
  return h;
}

// ---------------------------------------------------------------------------------------
// Blocking helpers for connection set-up, on non-blocking sockets with a real deadline.

Status SetNonBlockingAndOptions(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return UnavailableError("setsockopt(TCP_NODELAY): " + Errno());
  }
  const int buf = kSocketBufferBytes;
  // Larger buffers only help throughput; the kernel may clamp them, which is fine.
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  return OkStatus();
}

Status WaitFd(int fd, short events, TimePoint deadline, std::string_view what) {
  while (true) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = poll(&p, 1, PollMs(deadline));
    if (n > 0) return OkStatus();
    if (n < 0 && errno != EINTR) return UnavailableError(std::string(what) + ": poll: " + Errno());
    if (n == 0) return DeadlineExceededError(std::string(what) + ": timed out");
  }
}

Status WriteAll(int fd, std::span<const std::byte> data, TimePoint deadline,
                std::string_view what) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      KC_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, what));
    } else {
      return UnavailableError(std::string(what) + ": send: " + Errno());
    }
  }
  return OkStatus();
}

Status ReadAll(int fd, std::span<std::byte> data, TimePoint deadline, std::string_view what) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = recv(fd, data.data() + done, data.size() - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      return UnavailableError(std::string(what) + ": connection closed");
    } else if (errno == EAGAIN || errno == EINTR) {
      KC_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, what));
    } else {
      return UnavailableError(std::string(what) + ": recv: " + Errno());
    }
  }
  return OkStatus();
}

struct Hello {
  int rank = -1;
  int size = 0;
  int connection = -1;
  int connections = 0;
  std::string group;
};

// Reads a hello; kInvalidArgument for a malformed one.
Result<Hello> ReadHello(int fd, TimePoint deadline, std::string_view what) {
  std::byte fixed[kHelloFixedBytes];
  KC_RETURN_IF_ERROR(ReadAll(fd, fixed, deadline, what));
  if (GetU32(fixed) != kHelloMagic || GetU32(fixed + 4) != kVersion) {
    return InvalidArgumentError(std::string(what) + ": bad hello magic or version");
  }
  const uint32_t group_bytes = GetU32(fixed + 24);
  if (group_bytes > kMaxGroupBytes) {
    return InvalidArgumentError(std::string(what) + ": hello group too long");
  }
  Hello h;
  h.rank = static_cast<int>(GetU32(fixed + 8));
  h.size = static_cast<int>(GetU32(fixed + 12));
  h.connection = static_cast<int>(GetU32(fixed + 16));
  h.connections = static_cast<int>(GetU32(fixed + 20));
  std::vector<std::byte> group(group_bytes);
  KC_RETURN_IF_ERROR(ReadAll(fd, group, deadline, what));
  h.group.assign(reinterpret_cast<const char*>(group.data()), group.size());
  return h;
}

Result<Fd> ConnectTo(const std::string& host_port, TimePoint deadline) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return InvalidArgumentError("bad peer address " + host_port);
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const std::string port = host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return InvalidArgumentError("bad peer address " + host_port);
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  Fd fd(socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return UnavailableError("socket: " + Errno());
  KC_RETURN_IF_ERROR(SetNonBlockingAndOptions(fd.get()));
  if (connect(fd.get(), res->ai_addr, res->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return UnavailableError("connect " + host_port + ": " + Errno());
    KC_RETURN_IF_ERROR(WaitFd(fd.get(), POLLOUT, deadline, "connect " + host_port));
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return UnavailableError("connect " + host_port + ": " + std::strerror(err));
    }
  }
  return fd;
}

// ---------------------------------------------------------------------------------------
// Requests.

// A posted Send or Recv, completed once by the progress thread.
using ReqState = internal::CompletionRequest;

// What every chunk of one send carries (WorkItem::payload).
struct SendPayload {
  std::shared_ptr<ReqState> req;
  uint64_t id = 0;
  uint64_t tag = 0;
  uint64_t seq = 0;
  std::span<const std::byte> data;
  // Chunks written so far: by the progress thread or a sending caller (PumpInline), on
  // any of the peer's connections.
  std::atomic<int64_t> chunks_written = 0;
};

using MsgKey = std::pair<uint64_t, uint64_t>;  // (tag, seq)

struct PostedRecv {
  std::shared_ptr<ReqState> req;
  std::span<std::byte> data;
};

// Storage for messages that arrive before their Recv, reused across messages: a fresh
// large buffer per message would be mapped, zeroed and faulted in every time, which costs
// more than receiving it (ring steps of a large all-reduce are often unexpected by a few
// microseconds). Not thread-safe; the transport guards it with its mutex.
class BufferPool {
 public:
  struct Block {
    std::unique_ptr<std::byte[]> data;
    size_t capacity = 0;
  };

  // A block of at least `bytes`: the smallest free one that fits, else a new one.
  Block Take(size_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best == free_.end()) {
      return {.data = std::unique_ptr<std::byte[]>(new std::byte[std::max<size_t>(bytes, 1)]),
              .capacity = bytes};
    }
    Block b = std::move(*best);
    free_.erase(best);
    free_bytes_ -= b.capacity;
    return b;
  }

  // Keeps the largest free blocks, up to kMaxFree of them and kMaxFreeBytes in all: a ring
  // whose ranks start an operation at different times gets a burst of early segments in every
  // operation, and blocks given back to the allocator would come back as fresh pages.
  void Give(Block b) {
    if (b.data == nullptr) return;
    free_bytes_ += b.capacity;
    free_.push_back(std::move(b));
    while (free_.size() > kMaxFree || free_bytes_ > kMaxFreeBytes) {
      auto smallest =
          std::min_element(free_.begin(), free_.end(),
                           [](const Block& x, const Block& y) { return x.capacity < y.capacity; });
      free_bytes_ -= smallest->capacity;
      free_.erase(smallest);
    }
  }

 private:
  static constexpr size_t kMaxFree = 64;
  static constexpr size_t kMaxFreeBytes = size_t{64} << 20;
  size_t free_bytes_ = 0;
  std::vector<Block> free_;
};

// A message whose first chunk has arrived and whose last has not been consumed.
struct Incoming {
  uint64_t size = 0;
  uint64_t received = 0;
  std::byte* dest = nullptr;       // where its bytes go; null: discard them
  BufferPool::Block buffer;        // unexpected: owned storage
  std::optional<PostedRecv> recv;  // the matched Recv, if any
  bool unexpected = false;
  bool drop = false;  // a wrong-size Recv claimed it: discard when complete
  // The progress thread has counted its last chunk. Until then it looks the message up
  // again, so a Recv must leave it in place, even an empty one (received == size == 0).
  bool complete = false;
};

// One connection to a peer, with the progress thread's read/write state.
struct Conn {
  int id = 0;  // index in TcpTransport::conns_ and epoll tag
  int rank = -1;
  std::string address;
  Fd fd;
  // The peer's send queue, shared by its connections; owned by its Peer, which outlives it.
  LaneScheduler* scheduler = nullptr;
  // Send side: written by whoever holds out_mu, the progress thread or a thread whose Send
  // found the connection idle (TcpTransport::PumpInline).
  Mutex out_mu;
  std::optional<Chunk> chunk KC_GUARDED_BY(out_mu);
  std::byte out_header[kFrameHeaderBytes] KC_GUARDED_BY(out_mu);
  // Header + payload bytes of `chunk` (or of our close frame) written.
  size_t out_done KC_GUARDED_BY(out_mu) = 0;
  bool sending_close KC_GUARDED_BY(out_mu) = false;  // out_header holds our close frame
  bool want_out KC_GUARDED_BY(out_mu) = false;       // waiting for EPOLLOUT
  // Our side is shut (SHUT_WR) or given up; nothing more is written.
  bool write_done KC_GUARDED_BY(out_mu) = false;
  // Receive side (progress thread only).
  std::byte in_header[kFrameHeaderBytes];
  size_t in_header_done = 0;
  bool in_payload = false;
  FrameHeader in;
  std::byte* in_dest = nullptr;  // null: discard
  uint64_t in_done = 0;
  bool close_read = false;  // the peer's close frame arrived; only EOF may follow
  // EOF (or an error) after which nothing more is read. Written by the progress thread, read
  // by the send side too (UpdateEpoll).
  std::atomic<bool> read_done = false;
  bool in_epoll KC_GUARDED_BY(out_mu) = true;  // removed once both directions are done
};

// Per peer: its send queue and connections.
struct Peer {
  int rank = -1;
  std::unique_ptr<LaneScheduler> scheduler;
  std::vector<std::unique_ptr<Conn>> conns;  // connections_per_peer of them
  int close_frames = 0;                      // progress thread only
};

// A peer's transport as far as this rank knows. A closing peer's close frame has arrived on
// some of its connections (it reads nothing more), a closed one's on all of them (everything
// it sent before closing has been received).
enum class PeerState : uint8_t { kOpen, kClosing, kClosed };

constexpr uint64_t kWakeId = ~uint64_t{0};  // the eventfd's epoll tag

// A Transport over TCP connections driven by one epoll progress thread. Safe for concurrent
// use: callers touch the matching state under mu_ and the (thread-safe) send queues, and
// write a small message themselves under its connection's out_mu when the connection is idle
// (PumpInline); reading the sockets and the receive state belong to the progress thread.
class TcpTransport final : public Transport {
 public:
  TcpTransport(const TcpTransportOptions& o, std::vector<std::unique_ptr<Peer>> peers, Fd epoll_fd,
               Fd wake_fd)
      : rank_(o.rank),
        size_(o.size),
        clock_(o.clock),
        max_unexpected_bytes_(o.max_unexpected_bytes),
        close_timeout_(o.close_timeout),
        inline_max_bytes_(o.lanes.chunk_bytes),
        peers_(std::move(peers)),
        conns_(AllConns(peers_)),
        epoll_fd_(std::move(epoll_fd)),
        wake_fd_(std::move(wake_fd)),
        peer_state_(size_, PeerState::kOpen),
        send_seq_(size_),
        recv_seq_(size_),
        posted_(size_),
        incoming_(size_),
        thread_([this] { Run(); }) {}

  // Closes gracefully unless already failed: the progress thread writes what is queued and
  // a close frame on every connection, then waits for each peer to close its end (bounded by
  // close_timeout; see CloseGracefully).
  ~TcpTransport() override {
    {
      MutexLock lock(&mu_);
      closing_ = true;
    }
    Wake();
    io_stopped_.WaitForNotification();
  }
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Clock* clock() const override { return clock_; }

  Result<std::shared_ptr<Request>> Send(int peer, uint64_t tag, std::span<const std::byte> data,
                                        Lane lane) override {
    KC_LAYER_ENTRY(Layer::kComm, "tcp_transport");
    KC_RETURN_IF_ERROR(CheckPeer(peer));
    auto req = std::make_shared<ReqState>(clock_, "tcp_transport");
    auto payload = std::make_shared<SendPayload>();
    payload->req = req;
    payload->tag = tag;
    payload->data = data;
    {
      MutexLock lock(&mu_);
      if (!status_.ok()) return status_;
      if (peer_state_[peer] != PeerState::kOpen) {
        req->Complete(PeerClosed(peer));
        return std::shared_ptr<Request>(std::move(req));
      }
      payload->id = next_send_id_++;
      payload->seq = send_seq_[peer][tag]++;
      pending_sends_[payload->id] = req;
    }
    const uint64_t id = payload->id;
    Status s =
        peers_[peer]->scheduler->Enqueue(lane,
                                         WorkItem{.id = id,
                                                  .size_bytes = static_cast<int64_t>(data.size()),
                                                  .payload = std::move(payload)},
                                         clock_->Now());
    if (!s.ok()) {
      if (s.code() == ErrorCode::kCancelled) {
        MutexLock lock(&mu_);
        if (status_.ok() && peer_state_[peer] != PeerState::kOpen) {
          // The peer closed after the check above; its queue was closed and drained.
          pending_sends_.erase(id);
          req->Complete(PeerClosed(peer));
          return std::shared_ptr<Request>(std::move(req));
        }
      }
      // Closed by a failure (which completes the request) or a full queue.
      Fail(s.code() == ErrorCode::kCancelled
               ? AbortedError("tcp_transport: send queue closed")
               : ResourceExhaustedError("tcp_transport: send queue full: " + s.ToString()));
      MutexLock lock(&mu_);
      return status_;
    }
    if (static_cast<int64_t>(data.size()) > inline_max_bytes_ ||
        !PumpInline(*peers_[peer], static_cast<int64_t>(data.size()))) {
      Wake();
    }
    return std::shared_ptr<Request>(std::move(req));
  }

  Result<std::shared_ptr<Request>> Recv(int peer, uint64_t tag,
                                        std::span<std::byte> data) override {
    KC_LAYER_ENTRY(Layer::kComm, "tcp_transport");
    KC_RETURN_IF_ERROR(CheckPeer(peer));
    auto req = std::make_shared<ReqState>(clock_, "tcp_transport");
    BufferPool::Block ready;  // a complete unexpected message to copy out
    {
      MutexLock lock(&mu_);
      if (!status_.ok()) return status_;
      const MsgKey key{tag, recv_seq_[peer][tag]++};
      auto it = incoming_[peer].find(key);
      if (it == incoming_[peer].end()) {
        if (peer_state_[peer] == PeerState::kClosed) {
          req->Complete(PeerClosed(peer));
        } else {
          posted_[peer][key] = PostedRecv{req, data};
        }
        return std::shared_ptr<Request>(std::move(req));
      }
      Incoming& in = it->second;
      if (in.size != data.size()) {
        req->Complete(SizeMismatch(peer, tag, in.size, data.size()));
        if (in.complete) {
          unexpected_bytes_ -= static_cast<int64_t>(in.size);
          incoming_[peer].erase(it);
        } else {
          in.drop = true;
        }
        return std::shared_ptr<Request>(std::move(req));
      }
      if (!in.complete) {
        in.recv = PostedRecv{req, data};  // the progress thread copies it out when complete
        return std::shared_ptr<Request>(std::move(req));
      }
      ready = std::move(in.buffer);
      unexpected_bytes_ -= static_cast<int64_t>(in.size);
      incoming_[peer].erase(it);
    }
    if (!data.empty()) std::memcpy(data.data(), ready.data.get(), data.size());
    req->Complete(OkStatus());
    {
      MutexLock lock(&mu_);
      pool_.Give(std::move(ready));
    }
    return std::shared_ptr<Request>(std::move(req));
  }

  // The send queues' counters, and each connection's TCP_INFO (read from this thread: the
  // sockets stay open until destruction).
  LinkStats link_stats() const override {
    LinkStats out;
    out.lanes.emplace();
    for (const auto& p : peers_) {
      if (p == nullptr || p->scheduler == nullptr) continue;
      LinkStats one{.lanes = p->scheduler->metrics()};
      out += one;
    }
    for (const Conn* c : conns_) {
      tcp_info info{};
      socklen_t len = sizeof info;
      if (getsockopt(c->fd.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
      ++out.connections;
      out.retransmits += info.tcpi_total_retrans;
      out.max_rtt_s = std::max(out.max_rtt_s, info.tcpi_rtt / 1e6);
    }
    return out;
  }

  Status status() const override {
    MutexLock lock(&mu_);
    return status_;
  }

  void Abort(Status reason) override {
    if (reason.ok()) reason = AbortedError("tcp_transport: aborted");
    Fail(std::move(reason));
    // Wait for the progress thread to stop touching the callers' buffers, so that a request
    // failed by the abort really is finished. Bounded: the thread never blocks in I/O.
    if (std::this_thread::get_id() != thread_.get_id()) io_stopped_.WaitForNotification();
  }

 private:
  Status CheckPeer(int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return InvalidArgumentError("tcp_transport: bad peer " + std::to_string(peer) + " (rank " +
                                  std::to_string(rank_) + " of " + std::to_string(size_) + ")");
    }
    return OkStatus();
  }

  Status SizeMismatch(int peer, uint64_t tag, uint64_t message, size_t posted) const {
    return InvalidArgumentError("tcp_transport: recv from rank " + std::to_string(peer) + " tag " +
                                std::to_string(tag) + ": message has " + std::to_string(message) +
                                " bytes, recv posted " + std::to_string(posted));
  }

  // Records the first fatal error and wakes the progress thread, which fails every request.
  void Fail(Status s) {
    {
      MutexLock lock(&mu_);
      if (!status_.ok()) return;
      status_ = std::move(s);
    }
    Wake();
  }

  void Wake() {
    const uint64_t one = 1;
    // Only fails on counter overflow, when the thread is already due to wake.
    if (write(wake_fd_.get(), &one, sizeof(one)) < 0) return;
  }

  static std::vector<Conn*> AllConns(const std::vector<std::unique_ptr<Peer>>& peers) {
    std::vector<Conn*> out;
    for (const auto& p : peers) {
      if (p == nullptr) continue;
      for (const auto& c : p->conns) out.push_back(c.get());
    }
    return out;
  }

  Status PeerLost(const Conn& p, std::string_view what) const {
    return UnavailableError("tcp_transport rank=" + std::to_string(rank_) +
                            ": peer rank=" + std::to_string(p.rank) + " address=" + p.address +
                            ": " + std::string(what));
  }

  Status PeerClosed(int peer) const {
    return UnavailableError("tcp_transport rank=" + std::to_string(rank_) +
                            ": peer rank=" + std::to_string(peer) + " closed its transport");
  }

  void Run();
  // Writes what p's peer has queued. False after failing the transport (a socket error);
  // while closing, an error only gives the connection up.
  bool PumpOut(Conn& p) {
    MutexLock lock(&p.out_mu);
    return PumpOutLocked(p);
  }
  // With a budget, stops between chunks once `budget` payload bytes are written (setting
  // *stopped), leaving the rest of the queue to the progress thread.
  bool PumpOutLocked(Conn& p, int64_t budget = std::numeric_limits<int64_t>::max(),
                     bool* stopped = nullptr) KC_REQUIRES(p.out_mu);
  // Called by Send after queueing a message of `bytes` (at most one chunk): on a connection
  // to the peer that is idle (not held by the progress thread nor waiting for room in the
  // socket), the calling thread writes about that much of the queue itself, saving the
  // progress thread's wake-up. True when that left nothing for the progress thread to start
  // (the queue is written, or the connection waits for room and the progress thread goes on
  // from EPOLLOUT); false when it must be woken. Larger messages are the progress thread's:
  // their copies into the kernel overlap the caller's next reduction.
  bool PumpInline(Peer& peer, int64_t bytes);
  // Reads up to `want` (> 0) bytes from p's socket: the count read, 0 when nothing more is
  // there for now, or -1 when reading ended: EOF or an error after the peer's close frame
  // (p.read_done), else after failing the transport.
  ssize_t ReadSome(Conn& p, void* dst, size_t want);
  bool PumpIn(Conn& p);  // false: the transport failed (Fail called)
  bool StartChunk(Conn& p) KC_REQUIRES(p.out_mu);
  void FinishChunk(Conn& p) KC_REQUIRES(p.out_mu);
  void SetWantOut(Conn& p, bool want) KC_REQUIRES(p.out_mu);
  void UpdateEpoll(Conn& p) KC_REQUIRES(p.out_mu);
  // The peer's close frame arrived on p: the first one stops the sends to the peer, the
  // last one (one per connection) fails what is still expected from it.
  void OnCloseFrame(Conn& p);
  // The destructor's close: see TcpTransportOptions::close_timeout.
  void CloseGracefully();
  void DrainIn(Conn& p);  // while closing: reads and drops until EOF
  void GiveUp(Conn& p) {  // while closing: abandons the connection
    MutexLock lock(&p.out_mu);
    GiveUpLocked(p);
  }
  void GiveUpLocked(Conn& p) KC_REQUIRES(p.out_mu);
  void FailEverything();

  // Immutable after construction.
  const int rank_;
  const int size_;
  Clock* const clock_;  // not owned; outlives the transport (TcpTransportOptions::clock)
  const int64_t max_unexpected_bytes_;
  const Duration close_timeout_;
  const int64_t inline_max_bytes_;  // a Send of at most this many bytes may write it itself
  // Indexed by rank; null at rank_. The sockets are read by the progress thread only and
  // written under their connection's out_mu.
  std::vector<std::unique_ptr<Peer>> peers_;
  const std::vector<Conn*> conns_;  // every connection, by Conn::id; owned by peers_
  const Fd epoll_fd_;
  const Fd wake_fd_;

  // Set by CloseGracefully (progress thread); read by PumpInline too.
  std::atomic<bool> closing_phase_ = false;

  mutable Mutex mu_;
  Status status_ KC_GUARDED_BY(mu_);
  bool closing_ KC_GUARDED_BY(mu_) = false;               // the destructor has started
  std::vector<PeerState> peer_state_ KC_GUARDED_BY(mu_);  // by rank
  uint64_t next_send_id_ KC_GUARDED_BY(mu_) = 0;
  // Per peer: the next sequence number of each tag (a message's position among its tag).
  std::vector<std::unordered_map<uint64_t, uint64_t>> send_seq_ KC_GUARDED_BY(mu_);
  std::vector<std::unordered_map<uint64_t, uint64_t>> recv_seq_ KC_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<ReqState>> pending_sends_ KC_GUARDED_BY(mu_);
  std::vector<std::map<MsgKey, PostedRecv>> posted_ KC_GUARDED_BY(mu_);
  std::vector<std::map<MsgKey, Incoming>> incoming_ KC_GUARDED_BY(mu_);
  int64_t unexpected_bytes_ KC_GUARDED_BY(mu_) = 0;
  BufferPool pool_ KC_GUARDED_BY(mu_);

  Notification io_stopped_;  // the progress thread has failed every request and stopped
  std::jthread thread_;      // last: joined before the state it uses is destroyed
};

void TcpTransport::SetWantOut(Conn& p, bool want) {
  if (p.want_out == want) return;
  p.want_out = want;
  UpdateEpoll(p);
}

void TcpTransport::UpdateEpoll(Conn& p) {
  if (!p.in_epoll) return;
  if (p.read_done && p.write_done) {
    // Nothing more to do on it; a shut socket would report EPOLLHUP forever.
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, p.fd.get(), nullptr);
    p.in_epoll = false;
    return;
  }
  epoll_event ev{};
  ev.events = (p.read_done ? 0 : EPOLLIN) | (p.want_out ? EPOLLOUT : 0);
  ev.data.u64 = static_cast<uint64_t>(p.id);
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, p.fd.get(), &ev);
}

bool TcpTransport::StartChunk(Conn& p) {
  Result<Chunk> next = p.scheduler->Next(clock_->Now());
  if (!next.ok()) return false;
  p.chunk = *std::move(next);
  const auto* sp = static_cast<const SendPayload*>(p.chunk->payload.get());
  EncodeFrame(FrameHeader{.lane = static_cast<uint8_t>(p.chunk->lane),
                          .tag = sp->tag,
                          .seq = sp->seq,
                          .message_bytes = sp->data.size(),
                          .offset = static_cast<uint64_t>(p.chunk->offset_bytes),
                          .chunk_bytes = static_cast<uint32_t>(p.chunk->size_bytes)},
              p.out_header);
  p.out_done = 0;
  return true;
}

void TcpTransport::FinishChunk(Conn& p) {
  auto* sp = static_cast<SendPayload*>(p.chunk->payload.get());
  // With several connections a message's chunks finish in any order; count them.
  if (++sp->chunks_written == p.chunk->count) {
    {
      MutexLock lock(&mu_);
      pending_sends_.erase(sp->id);
    }
    sp->req->Complete(OkStatus());
  }
  p.chunk.reset();
}

bool TcpTransport::PumpInline(Peer& peer, int64_t bytes) {
  if (closing_phase_) return false;
  for (auto& c : peer.conns) {
    if (!c->out_mu.TryLock()) continue;
    // Waiting for room: the progress thread writes on from EPOLLOUT, our chunks included.
    bool stopped = false;
    const bool pumped =
        c->want_out || c->write_done || (PumpOutLocked(*c, bytes, &stopped) && !stopped);
    c->out_mu.Unlock();
    if (pumped) return true;
  }
  return false;
}

bool TcpTransport::PumpOutLocked(Conn& p, int64_t budget, bool* stopped) {
  int64_t written = 0;
  while (true) {
    if (p.write_done) {
      SetWantOut(p, false);
      return true;
    }
    if (!p.chunk && !p.sending_close && written >= budget) {
      if (stopped != nullptr) *stopped = true;
      return true;
    }
    if (!p.chunk && !p.sending_close && !StartChunk(p)) {
      if (!closing_phase_) {
        SetWantOut(p, false);
        return true;
      }
      // Closing, and every chunk of this peer's queue is taken: the close frame follows the
      // chunks written on this connection.
      EncodeClose(p.out_header);
      p.sending_close = true;
      p.out_done = 0;
    }
    const SendPayload* sp =
        p.sending_close ? nullptr : static_cast<const SendPayload*>(p.chunk->payload.get());
    const size_t chunk_bytes = p.sending_close ? 0 : static_cast<size_t>(p.chunk->size_bytes);
    const size_t total = kFrameHeaderBytes + chunk_bytes;
    iovec iov[2];
    int n_iov = 0;
    if (p.out_done < kFrameHeaderBytes) {
      iov[n_iov++] = {p.out_header + p.out_done, kFrameHeaderBytes - p.out_done};
    }
    const size_t payload_done = p.out_done > kFrameHeaderBytes ? p.out_done - kFrameHeaderBytes : 0;
    if (chunk_bytes > 0) {
      iov[n_iov++] = {
          const_cast<std::byte*>(sp->data.data()) + p.chunk->offset_bytes + payload_done,
          chunk_bytes - payload_done};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    const ssize_t n = sendmsg(p.fd.get(), &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        SetWantOut(p, true);
        return true;
      }
      if (closing_phase_) {
        GiveUpLocked(p);
        return true;
      }
      Fail(PeerLost(p, "send: " + Errno()));
      return false;
    }
    p.out_done += static_cast<size_t>(n);
    if (p.out_done < total) continue;
    if (p.sending_close) {
      // The peer reads our data, the close frame, then EOF.
      shutdown(p.fd.get(), SHUT_WR);
      p.sending_close = false;
      p.write_done = true;
    } else {
      written += static_cast<int64_t>(chunk_bytes);
      FinishChunk(p);
    }
  }
}

ssize_t TcpTransport::ReadSome(Conn& p, void* dst, size_t want) {
  while (true) {
    const ssize_t n = recv(p.fd.get(), dst, want, 0);
    if (n > 0) return n;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 0;
    if (p.close_read) {
      // After its close frame the peer sends nothing; a reset only loses our bytes to it,
      // which it drops anyway.
      p.read_done = true;
      MutexLock lock(&p.out_mu);
      UpdateEpoll(p);
      return -1;
    }
    // Without a close frame the peer crashed or aborted: what it sent may be cut short.
    Fail(PeerLost(p, n == 0 ? "connection closed" : "recv: " + Errno()));
    return -1;
  }
}

bool TcpTransport::PumpIn(Conn& p) {
  while (true) {
    if (p.read_done) return true;
    if (p.close_read) {
      std::byte extra;
      const ssize_t n = ReadSome(p, &extra, 1);
      if (n <= 0) return n == 0 || p.read_done;
      Fail(DataLossError("tcp_transport: data after the close frame from rank " +
                         std::to_string(p.rank)));
      return false;
    }
    if (!p.in_payload) {
      const ssize_t n =
          ReadSome(p, p.in_header + p.in_header_done, kFrameHeaderBytes - p.in_header_done);
      if (n <= 0) return n == 0;
      p.in_header_done += static_cast<size_t>(n);
      if (p.in_header_done < kFrameHeaderBytes) continue;
      p.in_header_done = 0;
      if (IsCloseFrame(p.in_header)) {
        p.close_read = true;
        OnCloseFrame(p);
        continue;
      }
      std::optional<FrameHeader> h = DecodeFrame(p.in_header);
      if (!h) {
        Fail(DataLossError("tcp_transport: malformed frame from rank " + std::to_string(p.rank)));
        return false;
      }
      p.in = *h;
      p.in_done = 0;
      p.in_payload = true;
      // Find or start the message this chunk belongs to.
      bool over_limit = false;
      {
        MutexLock lock(&mu_);
        const MsgKey key{h->tag, h->seq};
        auto it = incoming_[p.rank].find(key);
        if (it == incoming_[p.rank].end()) {
          Incoming in;
          in.size = h->message_bytes;
          auto posted = posted_[p.rank].find(key);
          if (posted != posted_[p.rank].end()) {
            if (posted->second.data.size() != in.size) {
              posted->second.req->Complete(
                  SizeMismatch(p.rank, h->tag, in.size, posted->second.data.size()));
              in.drop = true;
            } else {
              in.dest = posted->second.data.data();
              in.recv = std::move(posted->second);
            }
            posted_[p.rank].erase(posted);
          } else if (unexpected_bytes_ + static_cast<int64_t>(in.size) > max_unexpected_bytes_) {
            over_limit = true;
          } else {
            in.unexpected = true;
            unexpected_bytes_ += static_cast<int64_t>(in.size);
            in.buffer = pool_.Take(in.size);
            in.dest = in.buffer.data.get();
          }
          if (!over_limit) it = incoming_[p.rank].emplace(key, std::move(in)).first;
        }
        if (!over_limit) {
          p.in_dest = it->second.dest == nullptr ? nullptr : it->second.dest + h->offset;
        }
      }
      if (over_limit) {
        Fail(ResourceExhaustedError(
            "tcp_transport rank=" + std::to_string(rank_) + ": unexpected messages from rank " +
            std::to_string(p.rank) +
            " exceed max_unexpected_bytes=" + std::to_string(max_unexpected_bytes_)));
        return false;
      }
    }
    // Payload of the current chunk.
    if (p.in_done < p.in.chunk_bytes) {
      std::byte scratch[64 * 1024];
      const size_t want = static_cast<size_t>(p.in.chunk_bytes - p.in_done);
      std::byte* dst = p.in_dest != nullptr ? p.in_dest + p.in_done : scratch;
      const ssize_t n =
          ReadSome(p, dst, p.in_dest != nullptr ? want : std::min(want, sizeof(scratch)));
      if (n <= 0) return n == 0;
      p.in_done += static_cast<uint64_t>(n);
      if (p.in_done < p.in.chunk_bytes) continue;
    }
    // The chunk is complete.
    p.in_payload = false;
    std::optional<PostedRecv> done;
    BufferPool::Block copy_from;
    {
      MutexLock lock(&mu_);
      auto it = incoming_[p.rank].find(MsgKey{p.in.tag, p.in.seq});
      Incoming& in = it->second;
      in.received += p.in.chunk_bytes;
      if (in.received < in.size) continue;
      in.complete = true;
      if (in.unexpected && in.recv) {
        copy_from = std::move(in.buffer);
        unexpected_bytes_ -= static_cast<int64_t>(in.size);
      }
      if (in.recv || in.drop) {
        if (in.drop && in.unexpected) unexpected_bytes_ -= static_cast<int64_t>(in.size);
        done = std::move(in.recv);
        incoming_[p.rank].erase(it);
      }
      // Else: a complete unexpected message, waiting for its Recv.
    }
    if (done) {
      if (copy_from.data != nullptr && !done->data.empty()) {
        std::memcpy(done->data.data(), copy_from.data.get(), done->data.size());
      }
      done->req->Complete(OkStatus());
    }
    if (copy_from.data != nullptr) {
      MutexLock lock(&mu_);
      pool_.Give(std::move(copy_from));
    }
  }
}

void TcpTransport::OnCloseFrame(Conn& c) {
  Peer& peer = *peers_[c.rank];
  ++peer.close_frames;
  std::vector<std::shared_ptr<ReqState>> failed;
  if (peer.close_frames == 1) {
    // The peer reads nothing more: stop writing to it and fail the sends to it.
    {
      MutexLock lock(&mu_);
      peer_state_[c.rank] = PeerState::kClosing;
    }
    // A Send that passed its check before the state changed either queued its chunks before
    // this Close (they are drained below) or gets kCancelled and fails its own request.
    peer.scheduler->Close();
    std::vector<uint64_t> ids;
    auto fail_chunk = [&](const Chunk& chunk) {
      const auto* sp = static_cast<const SendPayload*>(chunk.payload.get());
      ids.push_back(sp->id);
      failed.push_back(sp->req);
    };
    for (auto& conn : peer.conns) {
      MutexLock lock(&conn->out_mu);
      if (conn->chunk) fail_chunk(*conn->chunk);
      conn->chunk.reset();
      conn->sending_close = false;
      // Our FIN tells the closing peer that it may close its socket without losing data.
      shutdown(conn->fd.get(), SHUT_WR);
      conn->write_done = true;
      conn->want_out = false;
      UpdateEpoll(*conn);
    }
    for (Result<Chunk> next = peer.scheduler->Next(clock_->Now()); next.ok();
         next = peer.scheduler->Next(clock_->Now())) {
      fail_chunk(*next);
    }
    MutexLock lock(&mu_);
    for (uint64_t id : ids) pending_sends_.erase(id);
  }
  if (peer.close_frames == static_cast<int>(peer.conns.size())) {
    // Every chunk the peer wrote has arrived (each connection is read in order), so what is
    // still awaited from it never comes. Complete messages stay for their Recvs.
    MutexLock lock(&mu_);
    peer_state_[c.rank] = PeerState::kClosed;
    for (auto& [key, pr] : posted_[c.rank]) failed.push_back(pr.req);
    posted_[c.rank].clear();
    auto& incoming = incoming_[c.rank];
    for (auto it = incoming.begin(); it != incoming.end();) {
      Incoming& in = it->second;
      if (in.received == in.size && !in.drop) {
        ++it;
        continue;
      }
      if (in.recv) failed.push_back(in.recv->req);
      if (in.unexpected) unexpected_bytes_ -= static_cast<int64_t>(in.size);
      it = incoming.erase(it);
    }
  }
  const Status s = PeerClosed(c.rank);
  for (auto& r : failed) r->Complete(s);
}

void TcpTransport::DrainIn(Conn& p) {
  while (!p.read_done) {
    std::byte scratch[64 * 1024];
    const ssize_t n = recv(p.fd.get(), scratch, sizeof(scratch), 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) {
      GiveUp(p);
      return;
    }
    p.read_done = true;  // EOF: the peer has read all it wanted and closed its end
    MutexLock lock(&p.out_mu);
    UpdateEpoll(p);
  }
}

void TcpTransport::GiveUpLocked(Conn& p) {
  shutdown(p.fd.get(), SHUT_RDWR);
  p.chunk.reset();  // its request is failed by FailEverything
  p.sending_close = false;
  p.write_done = true;
  p.read_done = true;
  UpdateEpoll(p);
}

void TcpTransport::CloseGracefully() {
  closing_phase_ = true;
  const TimePoint deadline = std::chrono::steady_clock::now() + close_timeout_;
  const Status destroyed =
      AbortedError("tcp_transport rank=" + std::to_string(rank_) + ": destroyed");
  // Recvs cannot complete any more: fail them. From here on the progress thread reads only
  // to drop (DrainIn), so it no longer touches their buffers.
  std::vector<std::shared_ptr<ReqState>> recvs;
  {
    MutexLock lock(&mu_);
    for (auto& m : posted_) {
      for (auto& [key, pr] : m) recvs.push_back(pr.req);
      m.clear();
    }
    for (auto& m : incoming_) {
      for (auto& [key, in] : m) {
        if (in.recv) recvs.push_back(in.recv->req);
      }
      m.clear();
    }
    unexpected_bytes_ = 0;
  }
  for (auto& r : recvs) r->Complete(destroyed);
  // Next hands out what is queued, then kCancelled: PumpOut then writes the close frame.
  for (auto& p : peers_) {
    if (p != nullptr) p->scheduler->Close();
  }
  auto all_done = [&] {
    return std::all_of(conns_.begin(), conns_.end(), [](Conn* c) {
      MutexLock lock(&c->out_mu);
      return c->read_done && c->write_done;
    });
  };
  for (Conn* c : conns_) {
    DrainIn(*c);
    PumpOut(*c);
  }
  epoll_event events[64];
  while (!all_done()) {
    // Every step: write the queue and the close frame, drop what arrives, await each EOF.
    // At close_timeout FailEverything shuts down what is left (a peer that keeps the socket
    // busy must not hold the close open).
    if (std::chrono::steady_clock::now() >= deadline) break;
    const int n = epoll_wait(epoll_fd_.get(), events, 64, PollMs(deadline));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) {
        uint64_t v;
        if (read(wake_fd_.get(), &v, sizeof(v)) < 0) {
          // EAGAIN: already drained.
        }
        continue;
      }
      Conn& c = *conns_[id];
      if ((events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0) DrainIn(c);
      if ((events[i].events & EPOLLOUT) != 0) PumpOut(c);
      // A reset or an error with nothing left to read: what is unwritten cannot go out.
      if ((events[i].events & (EPOLLERR | EPOLLHUP)) != 0 && c.read_done) GiveUp(c);
    }
  }
  MutexLock lock(&mu_);
  if (status_.ok()) status_ = destroyed;
}

void TcpTransport::FailEverything() {
  for (Conn* c : conns_) {
    // Peers see EOF at once, even before the fds are closed at destruction.
    shutdown(c->fd.get(), SHUT_RDWR);
    MutexLock lock(&c->out_mu);
    c->chunk.reset();
  }
  for (auto& p : peers_) {
    if (p != nullptr) p->scheduler->Close();
  }
  std::vector<std::shared_ptr<ReqState>> reqs;
  Status s;
  {
    MutexLock lock(&mu_);
    s = status_;
    for (auto& [id, req] : pending_sends_) reqs.push_back(req);
    pending_sends_.clear();
    for (auto& m : posted_) {
      for (auto& [key, pr] : m) reqs.push_back(pr.req);
      m.clear();
    }
    for (auto& m : incoming_) {
      for (auto& [key, in] : m) {
        if (in.recv) reqs.push_back(in.recv->req);
      }
      m.clear();
    }
  }
  // Drop the queued chunks: they hold the send payloads.
  for (auto& p : peers_) {
    if (p == nullptr) continue;
    while (p->scheduler->Next(clock_->Now()).ok()) {
    }
  }
  for (auto& r : reqs) r->Complete(s);
}

void TcpTransport::Run() {
  epoll_event events[64];
  while (true) {
    bool close = false;
    {
      MutexLock lock(&mu_);
      if (!status_.ok()) break;
      close = closing_;
    }
    if (close) {
      CloseGracefully();
      break;
    }
    // Blocks until a socket or the wake eventfd is ready; Fail and Send always wake it.
    const int n = epoll_wait(epoll_fd_.get(), events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      Fail(InternalError("tcp_transport: epoll_wait: " + Errno()));
      break;
    }
    bool woken = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) {
        uint64_t v;
        if (read(wake_fd_.get(), &v, sizeof(v)) < 0) {
          // EAGAIN: already drained; nothing else can fail on an eventfd.
        }
        woken = true;
        continue;
      }
      Conn& p = *conns_[id];
      if ((events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0 && !PumpIn(p)) break;
      if ((events[i].events & EPOLLOUT) != 0 && !PumpOut(p)) break;
    }
    if (woken) {
      // New sends may have been queued for any peer.
      for (Conn* c : conns_) {
        if (!PumpOut(*c)) break;
      }
    }
  }
  FailEverything();
  io_stopped_.Notify();
}

// ---------------------------------------------------------------------------------------
// Set-up.

std::string AddressKey(const std::string& group, int rank) {
  return group + "/tcp_transport/addr/" + std::to_string(rank);
}

}  // namespace

Result<std::unique_ptr<Transport>> CreateTcpTransport(const TcpTransportOptions& o) {
  KC_LAYER_ENTRY(Layer::kComm, "tcp_transport");
  if (o.store == nullptr) return InvalidArgumentError("tcp_transport: store is null");
  if (o.clock == nullptr) return InvalidArgumentError("tcp_transport: clock is null");
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return InvalidArgumentError("tcp_transport: bad rank " + std::to_string(o.rank) + " of size " +
                                std::to_string(o.size));
  }
  if (o.group.empty() || o.group.size() > kMaxGroupBytes) {
    return InvalidArgumentError("tcp_transport: group must have 1 to 1024 bytes");
  }
  if (o.connections_per_peer < 1 || o.connections_per_peer > kMaxConnectionsPerPeer) {
    return InvalidArgumentError("tcp_transport: connections_per_peer must be in [1, 64]");
  }
  if (o.lanes.chunk_bytes > (int64_t{1} << 31)) {
    return InvalidArgumentError("tcp_transport: lanes.chunk_bytes over 2 GiB");
  }
  LaneOptions lane_options = o.lanes;
  lane_options.queue_chunks = std::max<int64_t>(lane_options.queue_chunks, int64_t{1} << 40);
  KC_RETURN_IF_ERROR(ValidateLaneOptions(lane_options));

  const TimePoint real_deadline = std::chrono::steady_clock::now() + o.connect_timeout;
  const TimePoint store_deadline = o.store->clock()->Now() + o.connect_timeout;
  const std::string me = "tcp_transport rank=" + std::to_string(o.rank) + ": ";

  int port = 0;
  KC_ASSIGN_OR_RETURN(Fd listener,
                      hal::ListenTcp(o.bind_address, kSocketBufferBytes, &port, "bind_address"));
  const std::string my_address =
      (o.bind_address.find(':') != std::string::npos ? "[" + o.bind_address + "]"
                                                     : o.bind_address) +
      ":" + std::to_string(port);
  KC_RETURN_IF_ERROR(o.store->Set(AddressKey(o.group, o.rank), my_address));

  const int k = o.connections_per_peer;
  std::vector<std::unique_ptr<Peer>> peers(o.size);
  for (int r = 0; r < o.size; ++r) {
    if (r == o.rank) continue;
    peers[r] = std::make_unique<Peer>();
    peers[r]->rank = r;
    peers[r]->conns.resize(k);
  }
  auto add_conn = [&](int r, int c, Fd fd, std::string address) {
    auto conn = std::make_unique<Conn>();
    conn->rank = r;
    conn->address = std::move(address);
    conn->fd = std::move(fd);
    peers[r]->conns[c] = std::move(conn);
  };
  // Connect to every higher rank k times: send our hello, read theirs back.
  for (int r = o.rank + 1; r < o.size; ++r) {
    KC_ASSIGN_OR_RETURN(std::string addr, o.store->Get(AddressKey(o.group, r), store_deadline));
    for (int c = 0; c < k; ++c) {
      KC_ASSIGN_OR_RETURN(Fd fd, ConnectTo(addr, real_deadline));
      const std::string what = me + "hello with rank " + std::to_string(r) + " at " + addr;
      KC_RETURN_IF_ERROR(
          WriteAll(fd.get(), EncodeHello(o.group, o.rank, o.size, c, k), real_deadline, what));
      KC_ASSIGN_OR_RETURN(Hello h, ReadHello(fd.get(), real_deadline, what));
      if (h.group != o.group || h.rank != r || h.size != o.size || h.connection != c ||
          h.connections != k) {
        return UnavailableError(what + ": peer answered as another group or rank");
      }
      add_conn(r, c, std::move(fd), addr);
    }
  }
  // Accept k connections from every lower rank. A connection whose hello names another
  // group, generation, size or connection count, a bad rank or connection index, or one
  // already connected is closed; the wait goes on.
  int missing = o.rank * k;
  while (missing > 0) {
    KC_RETURN_IF_ERROR(WaitFd(listener.get(), POLLIN, real_deadline, me + "accepting peers"));
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    Fd fd(accept4(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len,
                  SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return UnavailableError(me + "accept: " + Errno());
    }
    char host[INET6_ADDRSTRLEN] = "?";
    int peer_port = 0;
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
      peer_port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      peer_port = ntohs(a->sin6_port);
    }
    const std::string peer_addr = std::string(host) + ":" + std::to_string(peer_port);
    if (!SetNonBlockingAndOptions(fd.get()).ok()) continue;
    // A stranger gets a bounded time to say hello; one that fails to is dropped. Hellos are
    // read one connection at a time, so a silent stranger delays set-up by up to that bound.
    const TimePoint hello_deadline =
        std::min(real_deadline, std::chrono::steady_clock::now() + kHelloTimeout);
    Result<Hello> h = ReadHello(fd.get(), hello_deadline, me + "hello from " + peer_addr);
    if (!h.ok()) continue;
    if (h->group != o.group || h->size != o.size || h->connections != k || h->rank < 0 ||
        h->rank >= o.rank || h->connection < 0 || h->connection >= k ||
        peers[h->rank]->conns[h->connection] != nullptr) {
      continue;  // refused: the Fd closes it
    }
    KC_RETURN_IF_ERROR(WriteAll(fd.get(), EncodeHello(o.group, o.rank, o.size, h->connection, k),
                                real_deadline, me + "hello to " + peer_addr));
    add_conn(h->rank, h->connection, std::move(fd), peer_addr);
    --missing;
  }
  listener.Reset();

  Fd epoll_fd(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) return UnavailableError(me + "epoll_create1: " + Errno());
  Fd wake_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd.valid()) return UnavailableError(me + "eventfd: " + Errno());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  if (epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev) != 0) {
    return UnavailableError(me + "epoll_ctl: " + Errno());
  }
  int next_id = 0;  // the order of TcpTransport::AllConns
  for (auto& p : peers) {
    if (p == nullptr) continue;
    if (o.make_scheduler) {
      KC_ASSIGN_OR_RETURN(p->scheduler, o.make_scheduler(lane_options, o.clock));
    } else {
      KC_ASSIGN_OR_RETURN(p->scheduler, LaneScheduler::Create(lane_options, o.clock));
    }
    for (auto& c : p->conns) {
      c->id = next_id++;
      c->scheduler = p->scheduler.get();
      ev.events = EPOLLIN;
      ev.data.u64 = static_cast<uint64_t>(c->id);
      if (epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, c->fd.get(), &ev) != 0) {
        return UnavailableError(me + "epoll_ctl: " + Errno());
      }
    }
  }
  return std::unique_ptr<Transport>(
      new TcpTransport(o, std::move(peers), std::move(epoll_fd), std::move(wake_fd)));
}

}  // namespace kc::comm
