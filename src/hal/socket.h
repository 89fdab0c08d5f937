// TCP client sockets shared by every layer that dials a peer (the topology probe, the
// rendezvous store client): name resolution and a non-blocking connect with a deadline.
#pragma once

#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "hal/fd.h"

namespace kc::hal {

// "host:port", with brackets around an IPv6 literal ("[::1]:7070").
std::string HostPort(std::string_view host, int port);

// Milliseconds from now until `deadline` (steady clock) for poll(): rounded up, 0 once it
// has passed.
int PollTimeoutMs(TimePoint deadline);

// Resolves `host` (a name or a numeric address) and connects a non-blocking TCP socket with
// TCP_NODELAY to host:port, one attempt per resolved address, bounded by `deadline` on the
// steady clock. Messages start with "`what` host:port: ".
// kInvalidArgument: the host does not resolve; kUnavailable: refused or unreachable (the
// last address's error); kDeadlineExceeded: still connecting at the deadline.
Result<Fd> ConnectTcp(std::string_view host, int port, TimePoint deadline, std::string_view what);

// A non-blocking TCP listener on the numeric address `host`, on a port the kernel picks
// (written to *port). buffer_bytes > 0 sets SO_SNDBUF and SO_RCVBUF before listen(), so that
// accepted sockets inherit them (best effort: the kernel may clamp them). Messages start
// with "`what`: ". kInvalidArgument: `host` is not a numeric address; kUnavailable: a
// socket, bind or listen error.
Result<Fd> ListenTcp(std::string_view host, int buffer_bytes, int* port, std::string_view what);

}  // namespace kc::hal
