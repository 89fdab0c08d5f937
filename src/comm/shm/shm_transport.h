// The shared-memory transport: ranks that are processes (or threads) of one host exchange
// messages through single-producer/single-consumer rings in /dev/shm mappings. The wire
// layout is in comm/doc/shm_protocol.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "comm/store.h"
#include "comm/transport.h"

namespace kc::comm {

struct ShmTransportOptions {
  // Where ranks publish their segment names. Not owned; must outlive CreateShmTransport
  // (the transport does not use it afterwards).
  Store* store = nullptr;
  // Unique per group and generation: it names the store keys and the /dev/shm segments.
  std::string group;
  int rank = 0;
  int size = 1;
  // Request::Wait deadlines are read on this clock. Not owned; must outlive the transport.
  Clock* clock = Clock::Real();
  // Bounds the rendezvous in CreateShmTransport (read on store->clock()).
  Duration connect_timeout = std::chrono::seconds(30);
  // Bytes of each (sender -> receiver) ring; a multiple of 64, at least 4096. Each rank's
  // segment holds size rings, so the group maps size * size * ring_bytes of /dev/shm.
  int64_t ring_bytes = 1 << 20;
  // Most bytes moved to or from one ring before the progress thread turns to another peer.
  int64_t chunk_bytes = 256 * 1024;
  // Idle passes the progress thread spins before it sleeps on the futex.
  int spin_iterations = 2000;
  // Bytes of messages that arrived before their Recv was posted that are buffered per
  // transport. Beyond it, a peer's ring is left unread (back-pressure) until a matching Recv
  // is posted; a single message is always admitted when nothing else is buffered.
  int64_t max_unexpected_bytes = 64 << 20;
};

// Creates rank `options.rank`'s endpoint: maps one segment per rank, publishes its name
// under "kc/shm/<group>/seg/<rank>" in the store, maps every peer's, then waits until all
// peers have mapped this rank's segment and unlinks it (so nothing remains in /dev/shm even
// if a process crashes later). Blocks up to connect_timeout: kDeadlineExceeded when a peer
// does not show up. kInvalidArgument for bad options; kUnavailable / kInternal when the
// segment cannot be created or mapped; kDataLoss when a peer's segment is malformed.
//
// The endpoint moves bytes on its own progress thread, which spins spin_iterations idle
// passes and then sleeps on a futex. Sends complete once their bytes are in the peer's ring.
// Messages are not lane-reordered yet (FIFO per peer; see the protocol doc). A peer that
// destroys its endpoint fails only the requests to and from it (kUnavailable); a peer that
// aborts (kAborted) or whose process dies (kUnavailable, noticed within about 50 ms) fails
// this endpoint, sticky.
Result<std::unique_ptr<Transport>> CreateShmTransport(const ShmTransportOptions& options);

}  // namespace kc::comm
