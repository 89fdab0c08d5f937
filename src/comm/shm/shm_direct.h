// The direct shared-memory collective engine: ranks of one host (processes, or threads in
// tests) read each other's buffers through shared mappings, so a collective costs about one
// pass over memory instead of message copies. The layout is in comm/doc/shm_direct.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "comm/reduce.h"
#include "comm/store.h"
#include "hal/compute.h"

namespace kc::comm {

struct ShmDirectOptions {
  // Rendezvous for Create and Allocate. Not owned; must outlive the group.
  Store* store = nullptr;
  // Unique per group and generation: it names the store keys and the /dev/shm segments.
  std::string group;
  int rank = 0;
  int size = 1;  // 1..1024
  // Collective deadlines are read on this clock. Not owned; must outlive the group.
  Clock* clock = Clock::Real();
  // Bounds the rendezvous in Create (read on store->clock()).
  Duration connect_timeout = std::chrono::seconds(30);
  // Per-rank shared scratch through which peers read user (unregistered) buffers; larger
  // operations are done in slices. At least 4096; the same on every rank.
  int64_t staging_bytes = 16 << 20;
  // Operations of at most this many bytes take the one-barrier path through a
  // double-buffered area of 2 * small_bytes per rank. 0..staging_bytes; the same on every rank.
  int64_t small_bytes = 32 << 10;
  // Polls of a waiting rank before it yields the CPU, then sleeps on a futex (at most 50 ms
  // at a time, to check peer liveness and the deadline). When the host's ranks (the larger
  // of size and host_ranks) exceed the number of online CPUs a waiter spins at most 64
  // polls, so oversubscribed ranks do not starve the ones doing work.
  int spin_iterations = 20000;
  // The ranks of the job on this host, this group's and others' (a sub-group of a larger
  // communicator shares the cores with the rest of it); 0: size.
  int host_ranks = 0;
};

// A buffer every rank of the group has mapped: rank r's data() is its own copy, and peers
// read it directly during collectives whose data lies inside it (the zero-copy path).
// Destroying it unmaps this rank's view of all copies; peers keep theirs. Not thread-safe.
class ShmRegion {
 public:
  virtual ~ShmRegion() = default;
  // This rank's copy: zero-filled at allocation, page aligned. Valid while *this lives.
  virtual std::span<std::byte> data() const = 0;
};

// One group of size() ranks on one host. Collectives follow comm/collectives.h: every rank
// calls the same collective with the same count, dtype, op and root, in the same order;
// data is host memory worked on in place; ChunkOf (comm/collectives.h) defines chunks.
//
// Blocking: every call waits for its peers, spinning then sleeping, bounded by `deadline`
// (on options.clock). Errors: bad arguments return kInvalidArgument before anything is
// touched, and the group stays usable. Any later failure fails the group, sticky (every
// later call returns the same Status): kDeadlineExceeded when a peer did not arrive in time;
// kAborted when a peer called Abort or failed itself (the message names the rank);
// kUnavailable when a peer's process died (noticed within about 50 ms); kInvalidArgument
// when ranks called different collectives (count, dtype, op, root or kind disagree).
//
// Thread safety: one collective (or Allocate) at a time per group; the caller serialises.
// status() and Abort() may be called from any thread at any time.
class ShmDirectGroup {
 public:
  // Creates rank options.rank's member: creates its segment with shm_open(O_EXCL), publishes
  // the name in the store, maps every peer's, and unlinks its own once every rank has mapped
  // it (nothing of the group stays in /dev/shm). Blocks up to connect_timeout:
  // kDeadlineExceeded when a peer does not show up. kInvalidArgument for bad options;
  // kUnavailable / kResourceExhausted when a segment cannot be created or mapped; kDataLoss
  // when a peer's segment does not match this group.
  static Result<std::unique_ptr<ShmDirectGroup>> Create(const ShmDirectOptions& options);

  virtual ~ShmDirectGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Collective: every rank calls it with the same `bytes` (> 0), in the same order as the
  // other collectives. Returns this rank's region, every peer's mapped too. Collectives whose
  // data lies inside a region this rank allocated read it in place (no staging copy);
  // peers may mix registered and user buffers freely. The store rendezvous is bounded by
  // `deadline` (converted to the store's clock). The region may outlive the group.
  virtual Result<std::shared_ptr<ShmRegion>> Allocate(size_t bytes, TimePoint deadline) = 0;

  // data: at least count elements of type, aligned for it. Afterwards every rank's data
  // holds op over all ranks' inputs (the same bits on every rank). kAvg: sum, then scaled by
  // 1 / size once. size 1 or count 0: a no-op.
  virtual Status Allreduce(std::span<std::byte> data, size_t count, hal::DataType type, ReduceOp op,
                           TimePoint deadline) = 0;
  // Afterwards this rank's chunk (ChunkOf(count, size, rank)) of data holds op over all
  // ranks' inputs of that chunk; the other chunks of data are left unchanged.
  virtual Status ReduceScatter(std::span<std::byte> data, size_t count, hal::DataType type,
                               ReduceOp op, TimePoint deadline) = 0;
  // In place: each rank contributes its chunk of data; afterwards every rank's data holds
  // every rank's chunk.
  virtual Status Allgather(std::span<std::byte> data, size_t count, hal::DataType type,
                           TimePoint deadline) = 0;
  // The root's data is copied into every rank's data (all of the same size).
  virtual Status Broadcast(std::span<std::byte> data, int root, TimePoint deadline) = 0;
  // The root's data gets op over all ranks' inputs; the others' data is left unchanged.
  virtual Status Reduce(std::span<std::byte> data, size_t count, hal::DataType type, ReduceOp op,
                        int root, TimePoint deadline) = 0;
  // Returns once every rank has entered it.
  virtual Status Barrier(TimePoint deadline) = 0;

  // OK, or the sticky failure.
  virtual Status status() const = 0;

  // Fails the group with `reason` (kAborted if OK is passed), sticky. A collective blocked
  // on another thread of this rank returns it; peers waiting on this rank fail promptly with
  // kAborted naming it.
  virtual void Abort(Status reason) = 0;
};

}  // namespace kc::comm
