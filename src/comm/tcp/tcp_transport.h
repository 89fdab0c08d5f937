// The TCP transport: a Transport between hosts over one TCP connection per pair of ranks,
// with priority lanes on the send side. Wire format: comm/doc/tcp_protocol.md.
//
// Threads: one progress thread per transport reads every connection and writes what is
// queued. A Send of at most one lane chunk on an idle connection is written by the calling
// thread itself (non-blocking; whatever the socket does not take is left to the progress
// thread), which saves a wake-up per small message (docs/design/tcp-path.md).
//
// Closing: destroying a transport closes it gracefully. Its peers receive everything it
// sent, then fail only the requests to and from it with kUnavailable ("peer rank=p closed")
// and stay usable for the other ranks. Abort, a fatal error or a crashed process instead
// fails every peer's whole transport (sticky kUnavailable).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "comm/lanes.h"
#include "comm/store.h"
#include "comm/transport.h"

namespace kc::comm {

struct TcpTransportOptions {
  // Rendezvous: each rank publishes "host:port" under `group`. Not owned; must outlive
  // CreateTcpTransport (it is not used afterwards).
  Store* store = nullptr;
  // Unique per group and generation; prefixes the store keys and is checked in the hello of
  // every connection, so a rank of another group or generation is refused.
  std::string group;
  int rank = 0;
  int size = 1;
  // The (numeric) address to listen on and publish for peers.
  std::string bind_address = "127.0.0.1";
  // Request deadlines are measured on it. Not owned; must outlive the transport.
  Clock* clock = Clock::Real();
  // Bounds the whole of CreateTcpTransport (store look-ups, connects, hellos).
  Duration connect_timeout = std::chrono::seconds(30);
  // Bounds the graceful close in the destructor (real time): writing what is still queued,
  // the close frames, and waiting for each peer to shut its end in answer. A live peer
  // answers at once; connections still open at the timeout are shut down as by Abort.
  Duration close_timeout = std::chrono::seconds(1);
  // TCP connections between each pair of ranks, in [1, 64]. With more than one, every idle
  // connection takes the peer's next chunk, so a large message is striped over all of them
  // (each chunk whole on one connection; the receiver places chunks by offset).
  int connections_per_peer = 1;
  // Chunking and priority of the send side (one LaneScheduler per peer). queue_chunks is
  // raised so that Send never blocks; the caller's buffers are the queue.
  LaneOptions lanes;
  // Bytes of messages received before their Recv was posted that may be buffered at once,
  // over all peers. Going over fails the transport with kResourceExhausted.
  int64_t max_unexpected_bytes = int64_t{1} << 30;
  // Test seam: builds each peer's send queue (default LaneScheduler::Create).
  std::function<Result<std::unique_ptr<LaneScheduler>>(const LaneOptions&, Clock*)> make_scheduler;
};

// Listens on options.bind_address, publishes the address in options.store, connects to the
// higher ranks and accepts the lower ones. Blocks until every pair is connected, or until
// connect_timeout: kDeadlineExceeded. kInvalidArgument for bad options, kUnavailable for
// socket errors.
Result<std::unique_ptr<Transport>> CreateTcpTransport(const TcpTransportOptions& options);

}  // namespace kc::comm
