#include "apps/kc/bench_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <charconv>
#include <cstring>
#include <string_view>

#include "hal/socket.h"

namespace kc::app {
namespace {

// As the TCP transport's (comm/tcp/tcp_transport.cc): the kernel may clamp them.
constexpr int kSocketBufferBytes = 4 * 1024 * 1024;

std::string Errno(std::string_view what) { return std::string(what) + ": " + std::strerror(errno); }

void SetBuffers(int fd) {
  const int bytes = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

std::string Key(const std::string& group, int rank) {
  return "kc/bench/" + group + "/wire/" + std::to_string(rank);
}

// Moves `data` through `fd` (send or receive) as far as the socket takes it now: the bytes
// moved, or an error.
Result<size_t> MoveSome(int fd, bool sending, std::byte* data, size_t bytes, int peer) {
  const ssize_t n = sending ? send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, data, bytes, MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return size_t{0};
  return UnavailableError(
      "wire: rank " + std::to_string(peer) +
      (n == 0 ? ": connection closed" : ": " + Errno(sending ? "send" : "recv")));
}

}  // namespace

Result<std::unique_ptr<WireRing>> WireRing::Connect(comm::Store& store, const std::string& group,
                                                    int rank, int size, const std::string& bind,
                                                    TimePoint deadline) {
  if (size < 2) return std::unique_ptr<WireRing>(new WireRing(-1, hal::Fd(), -1, hal::Fd()));
  int port = 0;
  KC_ASSIGN_OR_RETURN(hal::Fd listener,
                      hal::ListenTcp(bind, kSocketBufferBytes, &port, "wire: --bind"));
  KC_RETURN_IF_ERROR(store.Set(Key(group, rank), std::to_string(port) + " " + bind));

  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  const TimePoint store_deadline = store.clock()->Now() + (deadline - Clock::Real()->Now());
  KC_ASSIGN_OR_RETURN(std::string peer, store.Get(Key(group, right), store_deadline));
  const size_t space = peer.find(' ');
  int peer_port = 0;
  if (space == std::string::npos ||
      std::from_chars(peer.data(), peer.data() + space, peer_port).ptr != peer.data() + space) {
    return InternalError("wire: bad address \"" + peer + "\" from rank " + std::to_string(right));
  }
  KC_ASSIGN_OR_RETURN(hal::Fd out, hal::ConnectTcp(peer.substr(space + 1), peer_port, deadline,
                                                   "wire: rank " + std::to_string(right)));
  SetBuffers(out.get());
  // Say who we are, so the right neighbour knows it accepted its left one.
  const int32_t me = rank;
  if (send(out.get(), &me, sizeof(me), MSG_NOSIGNAL) != sizeof(me)) {
    return UnavailableError(Errno("wire: hello to rank " + std::to_string(right)));
  }
  while (true) {
    pollfd p{.fd = listener.get(), .events = POLLIN, .revents = 0};
    const int n = poll(&p, 1, hal::PollTimeoutMs(deadline));
    if (n == 0) return DeadlineExceededError("wire: rank " + std::to_string(left) + " never came");
    if (n < 0) {
      if (errno == EINTR) continue;
      return UnavailableError(Errno("wire: poll"));
    }
    hal::Fd in(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!in.valid()) continue;
    int32_t who = -1;
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    setsockopt(in.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (recv(in.get(), &who, sizeof(who), MSG_WAITALL) != sizeof(who) || who != left) continue;
    const int one = 1;
    setsockopt(in.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return std::unique_ptr<WireRing>(new WireRing(right, std::move(out), left, std::move(in)));
  }
}

Status WireRing::Stream(std::span<const std::byte> out, std::span<std::byte> in,
                        TimePoint deadline) {
  if (!right_fd_.valid()) return OkStatus();
  size_t sent = 0;
  size_t received = 0;
  while (sent < out.size() || received < in.size()) {
    if (sent < out.size()) {
      KC_ASSIGN_OR_RETURN(const size_t n,
                          MoveSome(right_fd_.get(), true, const_cast<std::byte*>(out.data()) + sent,
                                   out.size() - sent, right_));
      sent += n;
    }
    if (received < in.size()) {
      KC_ASSIGN_OR_RETURN(const size_t n, MoveSome(left_fd_.get(), false, in.data() + received,
                                                   in.size() - received, left_));
      received += n;
    }
    pollfd p[2] = {{.fd = right_fd_.get(),
                    .events = static_cast<short>(sent < out.size() ? POLLOUT : 0),
                    .revents = 0},
                   {.fd = left_fd_.get(),
                    .events = static_cast<short>(received < in.size() ? POLLIN : 0),
                    .revents = 0}};
    if (sent == out.size() && received == in.size()) break;
    const int n = poll(p, 2, hal::PollTimeoutMs(deadline));
    if (n == 0) return DeadlineExceededError("wire: the neighbours stopped moving data");
    if (n < 0 && errno != EINTR) return UnavailableError(Errno("wire: poll"));
  }
  return OkStatus();
}

}  // namespace kc::app
