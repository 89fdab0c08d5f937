// Measuring the network between hosts: a small TCP probe server (`kc topo serve`) and the
// client that measures bandwidth and latency to one (`kc topo probe --peers`). The wire
// protocol is in docs/design/measurement.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "hal/measure.h"

namespace kc::hal {

struct ProbeServerOptions {
  std::string bind_address = "0.0.0.0";  // a numeric IPv4 or IPv6 address
  int port = 0;                          // 0: an ephemeral port, see ProbeServer::port()
  // A connection that sends nothing this long is closed.
  Duration idle_timeout = std::chrono::seconds(60);
  // Connections beyond this wait in the kernel's backlog until one closes.
  int max_connections = 64;
};

// Serves probe connections on one thread of its own until stopped: echoes pings and
// swallows bandwidth streams, acknowledging each with its byte count and checksum.
// Safe for concurrent use.
class ProbeServer {
 public:
  // Binds and listens, then starts the server thread. kInvalidArgument for a bad address or
  // port, kUnavailable when the port is taken, kPermissionDenied when binding is refused.
  static Result<std::unique_ptr<ProbeServer>> Start(const ProbeServerOptions& options);

  // Stops (as Stop) before returning.
  virtual ~ProbeServer() = default;

  // The bound port (the ephemeral one when options.port was 0).
  virtual int port() const = 0;

  // Closes the listening socket and every connection, and joins the server thread. Clients
  // in the middle of a measurement see the connection close. Idempotent; concurrent calls
  // all return once the thread is joined. Never blocks on a client.
  virtual void Stop() = 0;
};

struct TcpProbeOptions {
  int64_t bandwidth_bytes = 64 * kMiB;  // streamed client -> server for the bandwidth
  int round_trips = 1000;               // 8-byte pings for the latency
  // For the whole measurement, name lookup excepted: connect, every read and write.
  Duration timeout = std::chrono::seconds(30);
  ProgressFn progress;  // may be empty; called on the caller's thread
};

struct TcpMeasurement {
  double bandwidth = 0;         // bytes delivered per second, client to server
  double latency = 0;           // seconds one way: median round trip / 2, 8-byte message
  int64_t bytes_delivered = 0;  // acknowledged by the server with a matching checksum
};

// Connects to the probe server at host:port and measures latency, then bandwidth, checking
// every echo and the server's checksum of the stream. Blocks up to options.timeout (plus the
// system's name lookup, which has no deadline of its own). Errors name host:port:
// kInvalidArgument for a port outside 1..65535, an empty or unknown host name, or bad
// options; kUnavailable when the peer refuses, cannot be reached or closes the connection
// (retry later); kDeadlineExceeded when the timeout passes; kDataLoss when an echo or the
// checksum differs; kFailedPrecondition when the peer does not speak the probe protocol.
Result<TcpMeasurement> MeasureTcpPeer(std::string_view host, int port,
                                      const TcpProbeOptions& options);

}  // namespace kc::hal
