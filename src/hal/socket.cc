#include "hal/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

namespace kc::hal {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

}  // namespace

std::string HostPort(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos) {
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

int PollTimeoutMs(TimePoint deadline) {
  const TimePoint now = std::chrono::steady_clock::now();
  if (deadline <= now) return 0;  // also keeps TimePoint::min() from overflowing below
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1 << 30));
}

Result<Fd> ConnectTcp(std::string_view host, int port, TimePoint deadline, std::string_view what) {
  const std::string prefix = std::string(what) + " " + HostPort(host, port) + ": ";
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* raw = nullptr;
  const std::string host_str(host);
  const std::string port_str = std::to_string(port);
  if (const int rc = getaddrinfo(host_str.c_str(), port_str.c_str(), &hints, &raw); rc != 0) {
    const std::string message = prefix + "cannot resolve the host: " + gai_strerror(rc);
    if (rc == EAI_NONAME || rc == EAI_SERVICE || rc == EAI_FAMILY) {
      return InvalidArgumentError(message);
    }
    return UnavailableError(message);
  }
  AddrInfo addresses(raw);
  Status last = UnavailableError(prefix + "no address to connect to");
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last = UnavailableError(prefix + "socket: " + std::strerror(errno));
      continue;
    }
    if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = UnavailableError(prefix + "connect: " + std::strerror(errno));
        continue;
      }
      pollfd pfd{.fd = fd.get(), .events = POLLOUT, .revents = 0};
      int r;
      do {
        r = poll(&pfd, 1, PollTimeoutMs(deadline));
      } while (r < 0 && errno == EINTR);
      if (r == 0) return DeadlineExceededError(prefix + "connect timed out");
      int err = 0;
      socklen_t len = sizeof(err);
      if (r < 0 || getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last = UnavailableError(prefix + "connect: " + std::strerror(err));
        continue;
      }
    }
    const int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
  }
  return last;
}

Result<Fd> ListenTcp(std::string_view host, int buffer_bytes, int* port, std::string_view what) {
  const std::string prefix = std::string(what) + ": ";
  addrinfo hints = {};
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* raw = nullptr;
  const std::string host_str(host);
  if (getaddrinfo(host_str.c_str(), "0", &hints, &raw) != 0 || raw == nullptr) {
    return InvalidArgumentError(prefix + "not a numeric address: " + host_str);
  }
  AddrInfo address(raw);
  Fd fd(socket(address->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return UnavailableError(prefix + "socket: " + std::strerror(errno));
  if (buffer_bytes > 0) {
    setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
  if (bind(fd.get(), address->ai_addr, address->ai_addrlen) != 0) {
    return UnavailableError(prefix + "bind " + host_str + ": " + std::strerror(errno));
  }
  if (listen(fd.get(), 128) != 0) {
    return UnavailableError(prefix + "listen: " + std::strerror(errno));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return UnavailableError(prefix + "getsockname: " + std::strerror(errno));
  }
  *port = bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return fd;
}

}  // namespace kc::hal
