// The rendezvous store over TCP: one server (usually beside rank 0 or in the launcher) keeps
// the map; every rank connects a client. The wire format is in src/comm/doc/store_protocol.md.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "comm/store.h"

namespace kc::comm {

struct TcpStoreServerOptions {
  std::string bind_address = "0.0.0.0";  // a numeric IPv4 or IPv6 address
  int port = 0;                          // 0: an ephemeral port, see TcpStoreServer::port()
  // When set, a client must say it first on each connection (TcpStoreClientOptions::token);
  // anything else it asks is answered with kPermissionDenied. "": any client.
  std::string token;
};

// Serves a HashStore to any number of TcpStoreClients from one thread of its own, until
// stopped. Blocked Get and Wait requests are parked and answered when their keys appear or
// their timeout passes (on the real clock). A request breaking the key or value limits is
// answered with kInvalidArgument; a malformed frame closes only its connection. Safe for
// concurrent use.
class TcpStoreServer {
 public:
  // Binds and listens, then starts the server thread. kInvalidArgument for a bad address or
  // port, kUnavailable when the port is taken, kPermissionDenied when binding is refused.
  static Result<std::unique_ptr<TcpStoreServer>> Start(const TcpStoreServerOptions& options);

  // Stops (as Stop) before returning.
  virtual ~TcpStoreServer() = default;

  // The bound port (the ephemeral one when options.port was 0).
  virtual int port() const = 0;

  // Closes the listening socket and every connection (their clients get kUnavailable) and
  // joins the server thread. Idempotent; never blocks on a client. The keys live only in this
  // object: a server started again begins empty.
  virtual void Stop() = 0;
};

struct TcpStoreClientOptions {
  // Bounds each call that has no deadline of its own (Set, Add, CompareSet, Delete, Check),
  // a reconnection included.
  Duration timeout = std::chrono::seconds(30);
  // Connect waits this long after the first refused attempt, doubling up to max_backoff.
  Duration initial_backoff = std::chrono::milliseconds(10);
  Duration max_backoff = std::chrono::seconds(1);
  // If set, called on Connect's thread after every failed attempt that will be retried,
  // with its error (for logging, or for a test to start the server).
  std::function<void(const Status&)> on_retry;
  // The server's token, said first on every connection (reconnections too); "": none.
  std::string token;
};

// A Store whose map lives in a TcpStoreServer. Deadlines are on the real steady clock
// (clock() is Clock::Real()) and cover the round trip. Calls from several threads are
// served one at a time over the one connection: a thread blocked in Get delays the others
// (each still returns kDeadlineExceeded at its own deadline), so give a thread that blocks
// for long its own client. After the connection fails, the call returns kUnavailable naming
// host:port and the next call tries once to reconnect. Safe for concurrent use.
class TcpStoreClient : public Store {
 public:
  // Connects to the server at host:port, retrying refused or unreachable attempts with
  // backoff until `deadline` (the server may start after the client). kInvalidArgument for
  // an empty or unknown host or a port outside 1..65535; kDeadlineExceeded, naming host:port
  // and the last error, when no attempt succeeded before the deadline.
  static Result<std::unique_ptr<TcpStoreClient>> Connect(std::string_view host, int port,
                                                         TimePoint deadline,
                                                         const TcpStoreClientOptions& options = {});

  // "host:port" of the server, as errors name it.
  virtual const std::string& peer() const = 0;
};

}  // namespace kc::comm
