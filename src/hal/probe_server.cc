#include "hal/probe_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "base/layer_guard.h"
#include "base/log.h"
#include "hal/fd.h"
#include "hal/socket.h"

namespace kc::hal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the probe protocol's words are read in host order");

// ---------------------------------------------------------------------------------------
// Wire format (docs/design/measurement.md): little-endian.
//   request  = magic:u32 op:u32 arg:u64                       (16 bytes)
//   kPing:  then `arg` times: client sends 8 bytes, server echoes them
//   kSink:  then the client sends `arg` bytes; the server answers
//   ack      = magic:u32 op:u32 received:u64 checksum:u64     (24 bytes)

constexpr uint32_t kMagic = 0x3150434b;  // "KCP1"
constexpr uint32_t kOpPing = 1;
constexpr uint32_t kOpSink = 2;
constexpr size_t kRequestBytes = 16;
constexpr size_t kAckBytes = 24;
constexpr size_t kPingBytes = 8;

void PutU32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetU32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Sum of word_i * (2i + 1) over the stream's 64-bit words, the last one zero-padded:
// position-dependent, so lost, repeated or reordered bytes change it.
class StreamChecksum {
 public:
  void Update(const unsigned char* p, size_t n) {
    while (partial_len_ > 0 && partial_len_ < 8 && n > 0) {
      partial_[partial_len_++] = *p++;
      --n;
    }
    if (partial_len_ == 8) {
      Add(GetU64(partial_));
      partial_len_ = 0;
    }
    for (; n >= 8; p += 8, n -= 8) Add(GetU64(p));
    std::memcpy(partial_, p, n);
    partial_len_ = n;
  }
  uint64_t Finish() const {
    if (partial_len_ == 0) return sum_;
    unsigned char last[8] = {};
    std::memcpy(last, partial_, partial_len_);
    return sum_ + GetU64(last) * (2 * index_ + 1);
  }

 private:
  void Add(uint64_t w) { sum_ += w * (2 * index_++ + 1); }
  uint64_t sum_ = 0;
  uint64_t index_ = 0;
  unsigned char partial_[8] = {};
  size_t partial_len_ = 0;
};

// StreamChecksum of `total` bytes made of `block` repeated (the last copy cut short), in
// O(block) rather than O(total): with W words per block, copy r adds C + 2rW*S, where C is
// the block's own checksum and S the sum of its words. REQUIRES: block.size() % 8 == 0.
uint64_t RepeatedBlockChecksum(const std::vector<unsigned char>& block, uint64_t total) {
  const uint64_t words = block.size() / 8;
  const uint64_t copies = total / block.size();
  const uint64_t tail = total % block.size();
  uint64_t c = 0, s = 0, tail_s = 0;
  for (uint64_t k = 0; k < words; ++k) {
    const uint64_t w = GetU64(block.data() + 8 * k);
    c += w * (2 * k + 1);
    s += w;
  }
  StreamChecksum tail_sum;
  tail_sum.Update(block.data(), tail);
  for (uint64_t k = 0; k * 8 < tail; ++k) {
    unsigned char word[8] = {};
    std::memcpy(word, block.data() + 8 * k, std::min<uint64_t>(8, tail - 8 * k));
    tail_s += GetU64(word);
  }
  // The sum over r < copies of 2rW*S is W*S*copies*(copies-1), halved exactly first.
  const uint64_t pairs = copies % 2 == 0 ? copies / 2 * (copies - 1) : (copies - 1) / 2 * copies;
  // The tail sits after `copies` blocks: its words' positions are shifted by copies*W.
  return copies * c + 2 * words * s * pairs + tail_sum.Finish() + 2 * copies * words * tail_s;
}

std::string Errno() { return std::strerror(errno); }

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// ---------------------------------------------------------------------------------------
// Server.

// One client connection, driven by the server thread only.
struct Connection {
  enum class Phase { kRequest, kPing, kSink };

  explicit Connection(Fd f) : fd(std::move(f)) {}

  Fd fd;
  TimePoint last_active;
  Phase phase = Phase::kRequest;
  unsigned char request[kRequestBytes] = {};
  size_t request_got = 0;
  uint64_t remaining = 0;  // pings or bytes left in the current op
  unsigned char ping[kPingBytes] = {};
  size_t ping_got = 0;
  uint64_t received = 0;
  StreamChecksum checksum;
  std::string out;  // bytes to send; out_sent of them are sent
  size_t out_sent = 0;
  bool broken = false;  // protocol error or I/O error: close it

  bool wants_write() const { return out_sent < out.size(); }

  void QueueAck() {
    unsigned char ack[kAckBytes];
    PutU32(ack, kMagic);
    PutU32(ack + 4, kOpSink);
    PutU64(ack + 8, received);
    PutU64(ack + 16, checksum.Finish());
    out.append(reinterpret_cast<const char*>(ack), kAckBytes);
    phase = Phase::kRequest;
  }

  // Runs the protocol over bytes received.
  void Consume(const unsigned char* p, size_t n) {
    while (n > 0 && !broken) {
      switch (phase) {
        case Phase::kRequest: {
          const size_t take = std::min(n, kRequestBytes - request_got);
          std::memcpy(request + request_got, p, take);
          request_got += take;
          p += take;
          n -= take;
          if (request_got < kRequestBytes) break;
          request_got = 0;
          const uint32_t op = GetU32(request + 4);
          remaining = GetU64(request + 8);
          if (GetU32(request) != kMagic || (op != kOpPing && op != kOpSink)) {
            broken = true;  // not a probe client: hang up
            break;
          }
          if (op == kOpPing) {
            phase = remaining > 0 ? Phase::kPing : Phase::kRequest;
          } else {
            received = 0;
            checksum = StreamChecksum();
            phase = Phase::kSink;
            if (remaining == 0) QueueAck();
          }
          break;
        }
        case Phase::kPing: {
          const size_t take = std::min(n, kPingBytes - ping_got);
          std::memcpy(ping + ping_got, p, take);
          ping_got += take;
          p += take;
          n -= take;
          if (ping_got < kPingBytes) break;
          ping_got = 0;
          out.append(reinterpret_cast<const char*>(ping), kPingBytes);  // echo
          if (--remaining == 0) phase = Phase::kRequest;
          break;
        }
        case Phase::kSink: {
          const size_t take = static_cast<size_t>(std::min<uint64_t>(n, remaining));
          checksum.Update(p, take);
          received += take;
          remaining -= take;
          p += take;
          n -= take;
          if (remaining == 0) QueueAck();
          break;
        }
      }
    }
  }
};

class ProbeServerImpl final : public ProbeServer {
 public:
  ProbeServerImpl(Fd listen_fd, Fd wake_fd, int port, const ProbeServerOptions& options)
      : options_(options),
        port_(port),
        listen_fd_(std::move(listen_fd)),
        wake_fd_(std::move(wake_fd)),
        thread_([this] { Run(); }) {}
  ~ProbeServerImpl() override { Stop(); }
  ProbeServerImpl(const ProbeServerImpl&) = delete;
  ProbeServerImpl& operator=(const ProbeServerImpl&) = delete;

  int port() const override { return port_; }

  void Stop() override {
    // Concurrent callers wait in call_once until the first has joined the thread.
    std::call_once(stop_once_, [this] {
      const uint64_t one = 1;
      // An eventfd write of 1 cannot fail short of a counter overflow.
      [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
      thread_.join();
    });
  }

 private:
  void Run();
  void Accept(std::vector<std::unique_ptr<Connection>>& connections);
  static void Read(Connection& c, std::vector<unsigned char>& scratch);
  static void Write(Connection& c);

  // Immutable after construction.
  const ProbeServerOptions options_;
  const int port_;
  // Owned by the server thread, which closes it when it ends.
  Fd listen_fd_;
  Fd wake_fd_;  // written by Stop, polled by the server thread
  std::once_flag stop_once_;
  std::jthread thread_;  // last: joined before the members it uses are destroyed
};

void ProbeServerImpl::Accept(std::vector<std::unique_ptr<Connection>>& connections) {
  while (connections.size() < static_cast<size_t>(options_.max_connections)) {
    const int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that went away before we took it
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // echoes go out at once
    auto c = std::make_unique<Connection>(Fd(fd));
    c->last_active = std::chrono::steady_clock::now();
    connections.push_back(std::move(c));
  }
}

void ProbeServerImpl::Read(Connection& c, std::vector<unsigned char>& scratch) {
  // At most 16 reads per turn, so one streaming client cannot starve the others or Stop().
  for (int reads = 0; reads < 16; ++reads) {
    const ssize_t n = recv(c.fd.get(), scratch.data(), scratch.size(), 0);
    if (n > 0) {
      c.Consume(scratch.data(), static_cast<size_t>(n));
      if (c.broken || c.out.size() - c.out_sent > (1 << 20)) return;  // let writes drain
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.broken = true;
    return;
  }
}

void ProbeServerImpl::Write(Connection& c) {
  while (c.wants_write()) {
    const ssize_t n =
        send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    c.broken = true;
    return;
  }
  c.out.clear();
  c.out_sent = 0;
}

void ProbeServerImpl::Run() {
  // Whatever ends the loop closes the listener too, so clients still in its backlog are
  // refused rather than left waiting for an answer.
  struct CloseListener {
    Fd* fd;
    ~CloseListener() { fd->Reset(); }
  } close_listener{&listen_fd_};
  std::vector<std::unique_ptr<Connection>> connections;
  std::vector<unsigned char> scratch(256 * 1024);
  std::vector<pollfd> fds;
  for (;;) {
    // [0] wake-up, [1] listener (while below the connection limit), then connections.
    fds.clear();
    fds.push_back({.fd = wake_fd_.get(), .events = POLLIN, .revents = 0});
    const bool accepting = connections.size() < static_cast<size_t>(options_.max_connections);
    fds.push_back({.fd = accepting ? listen_fd_.get() : -1, .events = POLLIN, .revents = 0});
    TimePoint next_idle = TimePoint::max();
    for (const auto& c : connections) {
      // Stop reading while a large echo backlog is unsent.
      const bool backlog = c->out.size() - c->out_sent > (1 << 20);
      fds.push_back(
          {.fd = c->fd.get(),
           .events = static_cast<short>((backlog ? 0 : POLLIN) | (c->wants_write() ? POLLOUT : 0)),
           .revents = 0});
      next_idle = std::min(next_idle, c->last_active + options_.idle_timeout);
    }
    const int timeout_ms = next_idle == TimePoint::max() ? -1 : PollTimeoutMs(next_idle);
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      KC_LOG(ERROR) << "probe server poll failed " << log::KV("port", port_) << " "
                    << log::KV("error", Errno());
      return;
    }
    if (fds[0].revents != 0) return;  // Stop(): the connections close with this frame
    const TimePoint now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = *connections[i];
      const short revents = fds[i + 2].revents;
      if (revents & (POLLIN | POLLHUP | POLLERR)) {
        Read(c, scratch);
        c.last_active = now;
      }
      if (!c.broken && c.wants_write()) Write(c);
      if (revents & POLLOUT) c.last_active = now;
      if (now - c.last_active >= options_.idle_timeout) c.broken = true;
    }
    std::erase_if(connections, [](const auto& c) { return c->broken; });
    if (fds[1].revents & POLLIN) Accept(connections);
  }
}

// ---------------------------------------------------------------------------------------
// Client.

// A connected socket with the measurement's deadline on every read and write.
class ClientConnection {
 public:
  ClientConnection(Fd fd, std::string peer, TimePoint deadline)
      : fd_(std::move(fd)), peer_(std::move(peer)), deadline_(deadline) {}

  Status WriteAll(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = send(fd_.get(), p, n, MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        KC_RETURN_IF_ERROR(Wait(POLLOUT));
        continue;
      }
      return UnavailableError("tcp probe " + peer_ + ": the peer closed the connection (" +
                              Errno() + ")");
    }
    return OkStatus();
  }

  Status ReadAll(void* data, size_t n) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t r = recv(fd_.get(), p, n, 0);
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      if (r == 0)
        return UnavailableError("tcp probe " + peer_ + ": the peer closed the connection");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        KC_RETURN_IF_ERROR(Wait(POLLIN));
        continue;
      }
      return UnavailableError("tcp probe " + peer_ + ": " + Errno());
    }
    return OkStatus();
  }

  Status Request(uint32_t op, uint64_t arg) {
    unsigned char req[kRequestBytes];
    PutU32(req, kMagic);
    PutU32(req + 4, op);
    PutU64(req + 8, arg);
    return WriteAll(req, sizeof(req));
  }

 private:
  Status Wait(short events) {
    for (;;) {
      pollfd pfd{.fd = fd_.get(), .events = events, .revents = 0};
      if (std::chrono::steady_clock::now() >= deadline_) {
        return DeadlineExceededError("tcp probe " + peer_ + ": no answer before the deadline");
      }
      const int r = poll(&pfd, 1, PollTimeoutMs(deadline_));
      if (r > 0) return OkStatus();  // readable, writable, or an error the next call reports
      if (r < 0 && errno != EINTR) return InternalError("tcp probe: poll: " + Errno());
    }
  }

  Fd fd_;
  std::string peer_;
  TimePoint deadline_;
};

Result<ClientConnection> Connect(std::string_view host, int port, TimePoint deadline) {
  KC_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(host, port, deadline, "tcp probe"));
  return ClientConnection(std::move(fd), HostPort(host, port), deadline);
}

}  // namespace

Result<std::unique_ptr<ProbeServer>> ProbeServer::Start(const ProbeServerOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "probe_server");
  const std::string where = HostPort(options.bind_address, options.port);
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("probe server " + where + ": port must be 0 to 65535");
  }
  if (options.max_connections < 1 || options.idle_timeout <= Duration::zero()) {
    return InvalidArgumentError("probe server " + where +
                                ": max_connections and idle_timeout must be positive");
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* raw = nullptr;
  const std::string port_str = std::to_string(options.port);
  if (const int rc = getaddrinfo(options.bind_address.c_str(), port_str.c_str(), &hints, &raw);
      rc != 0) {
    return InvalidArgumentError("probe server " + where +
                                ": bad bind address: " + gai_strerror(rc));
  }
  AddrInfo address(raw);
  Fd fd(socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               address->ai_protocol));
  if (fd.get() < 0) return UnavailableError("probe server " + where + ": socket: " + Errno());
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), address->ai_addr, address->ai_addrlen) != 0) {
    const std::string what = "probe server " + where + ": bind: " + Errno();
    if (errno == EACCES) return PermissionDeniedError(what);
    if (errno == EADDRNOTAVAIL) return InvalidArgumentError(what);
    return UnavailableError(what);
  }
  if (listen(fd.get(), 128) != 0) {
    return UnavailableError("probe server " + where + ": listen: " + Errno());
  }
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return InternalError("probe server " + where + ": getsockname: " + Errno());
  }
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  Fd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake.get() < 0) return ResourceExhaustedError("probe server: eventfd: " + Errno());
  try {
    return std::unique_ptr<ProbeServer>(
        std::make_unique<ProbeServerImpl>(std::move(fd), std::move(wake), port, options));
  } catch (const std::system_error& e) {  // the thread could not be started
    return ResourceExhaustedError("probe server " + where + ": " + e.what());
  }
}

Result<TcpMeasurement> MeasureTcpPeer(std::string_view host, int port,
                                      const TcpProbeOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "measure");
  const std::string peer = HostPort(host, port);
  if (host.empty()) return InvalidArgumentError("tcp probe " + peer + ": empty host name");
  if (port < 1 || port > 65535) {
    return InvalidArgumentError("tcp probe " + peer + ": port must be 1 to 65535");
  }
  if (options.bandwidth_bytes < 1 || options.round_trips < 1 ||
      options.timeout <= Duration::zero()) {
    return InvalidArgumentError("tcp probe " + peer +
                                ": bandwidth_bytes, round_trips and timeout must be positive");
  }
  auto progress = [&](double fraction, std::string_view what) {
    if (options.progress) options.progress(fraction, what);
  };
  const TimePoint deadline = std::chrono::steady_clock::now() + options.timeout;
  KC_ASSIGN_OR_RETURN(ClientConnection conn, Connect(host, port, deadline));
  progress(0.0, "tcp latency");

  // Latency: numbered 8-byte pings, each echoed before the next goes.
  KC_RETURN_IF_ERROR(conn.Request(kOpPing, static_cast<uint64_t>(options.round_trips)));
  std::vector<double> rtt(static_cast<size_t>(options.round_trips));
  for (int i = 0; i < options.round_trips; ++i) {
    unsigned char ping[kPingBytes], echo[kPingBytes];
    PutU64(ping, static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 1);
    const auto t0 = std::chrono::steady_clock::now();
    KC_RETURN_IF_ERROR(conn.WriteAll(ping, sizeof(ping)));
    KC_RETURN_IF_ERROR(conn.ReadAll(echo, sizeof(echo)));
    rtt[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (std::memcmp(ping, echo, kPingBytes) != 0) {
      return DataLossError("tcp probe " + peer + ": ping " + std::to_string(i) +
                           " came back changed");
    }
  }
  std::nth_element(rtt.begin(), rtt.begin() + rtt.size() / 2, rtt.end());
  TcpMeasurement m;
  m.latency = rtt[rtt.size() / 2] / 2;
  progress(0.2, "tcp bandwidth");

  // Bandwidth: a stream of a repeated 1 MiB pattern; the server's checksum must match ours.
  std::vector<unsigned char> block(static_cast<size_t>(kMiB));
  for (size_t i = 0; i < block.size(); ++i) {
    block[i] = static_cast<unsigned char>((i * 131 + (i >> 8) * 7) & 0xff);
  }
  const uint64_t expected =
      RepeatedBlockChecksum(block, static_cast<uint64_t>(options.bandwidth_bytes));
  const auto t0 = std::chrono::steady_clock::now();
  KC_RETURN_IF_ERROR(conn.Request(kOpSink, static_cast<uint64_t>(options.bandwidth_bytes)));
  // An update every 1/16 of the stream or every 256 MiB, whichever comes first.
  const int64_t step = std::max<int64_t>(1, std::min(options.bandwidth_bytes / 16, 256 * kMiB));
  int64_t next_report = step;
  for (int64_t sent = 0; sent < options.bandwidth_bytes;) {
    const size_t n = static_cast<size_t>(
        std::min<int64_t>(options.bandwidth_bytes - sent, static_cast<int64_t>(block.size())));
    KC_RETURN_IF_ERROR(conn.WriteAll(block.data(), n));
    sent += static_cast<int64_t>(n);
    if (sent >= next_report) {
      next_report += step;
      progress(0.2 + 0.75 * static_cast<double>(sent) / options.bandwidth_bytes, "tcp bandwidth");
    }
  }
  unsigned char ack[kAckBytes];
  KC_RETURN_IF_ERROR(conn.ReadAll(ack, sizeof(ack)));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (GetU32(ack) != kMagic || GetU32(ack + 4) != kOpSink) {
    return FailedPreconditionError("tcp probe " + peer + ": the peer is not a kc probe server");
  }
  if (GetU64(ack + 8) != static_cast<uint64_t>(options.bandwidth_bytes) ||
      GetU64(ack + 16) != expected) {
    return DataLossError("tcp probe " + peer + ": the server received " +
                         std::to_string(GetU64(ack + 8)) + " bytes with another checksum");
  }
  m.bytes_delivered = options.bandwidth_bytes;
  m.bandwidth = static_cast<double>(options.bandwidth_bytes) / seconds;
  progress(1.0, "tcp done");
  return m;
}

}  // namespace kc::hal
