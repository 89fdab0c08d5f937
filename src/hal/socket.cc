#include "hal/socket.h"

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

}  // namespace kc::hal
