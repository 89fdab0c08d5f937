// The shared-memory transport: ranks that are processes (or threads) of one host exchange
// messages through single-producer/single-consumer rings in /dev/shm mappings. The wire
// layout is in comm/doc/shm_protocol.md.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "comm/lanes.h"
#include "comm/store.h"
#include "comm/transport.h"

namespace kc::comm {

// A byte count per lane, indexed by the Lane's value. A single integer sets every lane, so
// `.ring_bytes = 64 << 10` and `.ring_bytes = {1 << 20, 1 << 20, 256 << 10, 256 << 10}`
// both work. A plain copyable value.
struct ShmLaneBytes {
  constexpr ShmLaneBytes(int64_t all)  // NOLINT(google-explicit-constructor): see above
      : bytes{all, all, all, all} {}
  constexpr ShmLaneBytes(int64_t gradient, int64_t activation, int64_t control, int64_t telemetry)
      : bytes{gradient, activation, control, telemetry} {}
  constexpr int64_t operator[](Lane lane) const { return bytes[static_cast<size_t>(lane)]; }

  std::array<int64_t, kNumLanes> bytes;
};

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
  // Bytes of each (sender -> receiver, lane) ring; each a multiple of 64, at least 4096.
  // Every rank's segment holds size x kNumLanes rings, so the group maps
  // size * size * (sum over lanes of ring_bytes) of /dev/shm: 160 MiB for 8 ranks with the
  // defaults. A low lane's full ring never holds up a higher lane.
  ShmLaneBytes ring_bytes = {1 << 20, 1 << 20, 256 << 10, 256 << 10};
  // Most bytes of a lane copied into or out of one ring in one step of the progress thread.
  // A message posted on a higher lane waits for at most one such piece of a lower lane
  // (at each end), so the lower lanes use small pieces.
  ShmLaneBytes chunk_bytes = {256 << 10, 256 << 10, 32 << 10, 32 << 10};
  // Idle steps the progress thread spins before it sleeps on the futex.
  int spin_iterations = 2000;
  // Bytes of messages of each lane that arrived before their Recv was posted that are
  // buffered per transport. Beyond it, that lane's ring from the peer is left unread
  // (back-pressure) until a matching Recv is posted; a single message is always admitted
  // when nothing else of its lane is buffered. Lanes never take from each other's budget.
  ShmLaneBytes max_unexpected_bytes = 64 << 20;
};

// Creates rank `options.rank`'s endpoint: maps one segment per rank, publishes its name
// under "kc/shm/<group>/seg/<rank>" in the store, maps every peer's, then waits until all
// peers have mapped this rank's segment and unlinks it (so nothing remains in /dev/shm even
// if a process crashes later). Blocks up to connect_timeout: kDeadlineExceeded when a peer
// does not show up. kInvalidArgument for bad options; kUnavailable / kInternal when the
// segment cannot be created or mapped; kDataLoss when a peer's segment is malformed.
//
// The endpoint moves bytes on its own progress thread, which spins spin_iterations idle
// steps and then sleeps on a futex. Sends complete once their bytes are in the peer's ring.
// Each lane has its own ring per pair; the progress threads serve the highest lane that can
// move first (with a small starvation guard for the lower lanes), so a flood on a low lane
// does not hold up a higher one. Messages with one tag between two ranks arrive in posting
// order within a lane; across lanes there is no order (see the protocol doc). A peer that
// destroys its endpoint fails only the requests to and from it (kUnavailable); a peer that
// aborts (kAborted) or whose process dies (kUnavailable, noticed within about 50 ms) fails
// this endpoint, sticky.
Result<std::unique_ptr<Transport>> CreateShmTransport(const ShmTransportOptions& options);

}  // namespace kc::comm
