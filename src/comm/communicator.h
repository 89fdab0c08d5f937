// The communicator: a group of ranks and the collectives a training job runs on it, the way
// a torch ProcessGroup or an NCCL communicator is used. It picks the links (shared memory
// between the ranks of one host, TCP between hosts), the algorithm per operation (ring,
// recursive doubling, hierarchical, direct shared-memory reads), and runs operations in
// order on its own thread; every call returns a Work handle at once.
//
//   KC_ASSIGN_OR_RETURN(auto comm, Communicator::Create({.store = &store, .group = "job7/g0",
//                                                          .rank = rank, .size = world}));
//   KC_ASSIGN_OR_RETURN(auto work, comm->Allreduce(std::span(grad), ReduceOp::kAvg));
//   ...  // overlap other work
//   KC_RETURN_IF_ERROR(work->Wait());
//
// Every rank of a communicator calls the same collectives in the same order with the same
// count, dtype, op and root (as with MPI and NCCL). Sub-groups (TP, PP, DP groups) come from
// Split or SubGroup, which every rank of the parent calls. User guide: docs/user-guide/comm.md.
//
// Failures: every operation has a deadline (OpOptions::timeout, else the communicator's).
// A dead peer, an aborting peer or a deadline surfaces as the status of the Work within the
// deadline — never a hang — and fails the communicator, sticky: every queued and later
// operation fails with the same status until the group is rebuilt (a new communicator with a
// new group name or generation; see comm/rendezvous.h). Bad arguments are kInvalidArgument
// on that call only and change nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "comm/collectives.h"
#include "comm/lanes.h"
#include "comm/rate_limit.h"
#include "comm/reduce.h"
#include "comm/store.h"
#include "comm/transport.h"
#include "hal/compute.h"
#include "hal/topology.h"

namespace kc::comm {

enum class TransportKind : uint8_t {
  kAuto = 0,  // shared memory between ranks of one host, TCP between hosts
  kShm = 1,   // shared memory only: every rank must be on one host
  kTcp = 2,   // TCP between every pair, also within a host
};
std::string_view TransportKindName(TransportKind kind);  // "auto", "shm", "tcp"
std::optional<TransportKind> TransportKindFromName(std::string_view name);

struct CommunicatorOptions {
  // Rendezvous (comm/store.h). Not owned; must outlive the communicator and its sub-groups
  // (Split, SubGroup and Allocate use it).
  Store* store = nullptr;
  // Unique per group and generation: prefixes the store keys and names the shm segments.
  std::string group;
  int rank = 0;
  int size = 1;
  // The host this rank runs on; ranks with equal hosts share memory and form the fast
  // groups of the hierarchical algorithm. Empty: this machine's host name.
  std::string host;
  TransportKind transport = TransportKind::kAuto;
  // The numeric address the TCP transport listens on and publishes.
  std::string bind_address = "127.0.0.1";
  // Deadlines are read on it. Not owned; must outlive the communicator.
  Clock* clock = Clock::Real();
  // Bounds Create (rendezvous, connects, mappings), Split and Allocate.
  Duration connect_timeout = std::chrono::seconds(60);
  // Deadline of an operation whose OpOptions::timeout is zero, counted from the call.
  Duration timeout = std::chrono::minutes(5);
  // kAuto chooses per operation (see Algorithm below); anything else is used for every
  // operation that has it, and an operation on which it cannot run is kInvalidArgument.
  Algorithm algorithm = Algorithm::kAuto;
  // kAuto: all-reduces of at most this many bytes use recursive doubling instead of the
  // ring when there is no direct shared-memory path.
  int64_t small_message_bytes = 64 << 10;
  // Shared scratch per rank for collectives on user buffers on the direct path; larger
  // operations run in slices.
  int64_t staging_bytes = 16 << 20;
  // Shm transport: bytes of each ring, every lane; 0 keeps the transport's per-lane
  // defaults (see comm/shm/shm_transport.h).
  int64_t shm_ring_bytes = 0;
  // TCP transport: connections per pair of ranks, in [1, 64].
  int tcp_connections_per_peer = 1;
  // TCP transport: the priority lanes' chunking, queues and order (the admin's comm limits
  // file, comm/comm_limits_config.h).
  LaneOptions lanes;
  // The job's rate limiter (comm/rate_limit.h), built from the admin's configuration;
  // every operation is admitted through it before it runs. Not owned; may be shared by
  // several communicators of one job; null: no limit.
  RateLimiter* rate_limiter = nullptr;
  // The L1 topology of the ranks' devices (hal/topology.h) and the device of each rank in it
  // (devices[r] indexes topology->device(), one per rank). With them, kAuto chooses each
  // all-reduce by the topology's cost model for the group's actual devices and links
  // (Topology::Collective: ring, recursive doubling for its tree, or hierarchical), the
  // estimate `kc topo report` advises from, instead of by size alone. The hierarchical
  // algorithm groups ranks by host. Null: the size rule (small_message_bytes). `devices`
  // empty with a topology: by host name, the ranks of a host (in rank order) take its devices
  // in the topology's order; a host the topology lacks, or one with too few devices, is
  // kInvalidArgument.
  std::shared_ptr<const hal::Topology> topology;
  std::vector<int> devices;
};

struct OpOptions {
  // The operation's deadline, counted from the call; zero: CommunicatorOptions::timeout.
  Duration timeout{};
  // kAuto: the communicator's choice (CommunicatorOptions::algorithm).
  Algorithm algorithm = Algorithm::kAuto;
  Lane lane = Lane::kGradient;
  // All-reduce only: what f32 sums and averages travel as between ranks (collectives.h's
  // WireFormat): kBf16 halves the bytes of the ring, and of the hierarchical all-reduce's ring
  // across hosts; the direct shared-memory engine and recursive doubling send f32 still.
  WireFormat wire = WireFormat::kNative;
};

// The handle of one operation. Safe for concurrent use.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completes or its own deadline passes (it then fails with
  // kDeadlineExceeded). The calling thread may run queued operations itself while it waits.
  virtual Status Wait() = 0;
  // As Wait(), but gives up at `deadline` with kDeadlineExceeded while the operation is
  // still pending (it keeps running; Wait again later).
  virtual Status Wait(TimePoint deadline) = 0;
  // nullopt while pending, else what Wait returns.
  virtual std::optional<Status> Test() = 0;
};

// Memory allocated through a communicator. On the direct shared-memory path every rank of
// the group has it mapped, so collectives on it read peers' data in place without copies.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual std::span<std::byte> bytes() = 0;
  template <typename T>
  std::span<T> as() {
    std::span<std::byte> b = bytes();
    return {reinterpret_cast<T*>(b.data()), b.size() / sizeof(T)};
  }
};

// Counters since creation. A plain value.
struct CommunicatorMetrics {
  uint64_t ops = 0;   // operations completed, failed ones included
  int64_t bytes = 0;  // payload bytes of those operations (buffer sizes)
  uint64_t failed = 0;
  uint64_t rate_limited = 0;   // operations that waited for the rate limiter
  Duration rate_limit_wait{};  // total time they waited
  // Its links' (Transport::link_stats; a sub-group's are its root's): the TCP send queues'
  // lanes, retransmits and round trips.
  LinkStats links;
};

// One operation of a communicator as its rank ran it (OpProgress::recent). Times are read
// from the coarse monotonic clock (CLOCK_MONOTONIC_COARSE, a few milliseconds of resolution,
// the steady clock's epoch), so operations shorter than a tick show as taking no time.
struct OpRecord {
  std::string op;  // "allreduce", "barrier", ...
  uint64_t seq = 0;
  int64_t bytes = 0;
  TimePoint start{};
  std::optional<TimePoint> end;  // empty: not finished
};

// How many of its newest operations a communicator keeps for OpProgress::recent.
inline constexpr int kOpHistory = 16;

// Where one rank is in the collectives of one communicator (hang localisation): the newest
// operation it started, and whether it has finished. Every rank of a communicator runs its
// collectives in one order, so ranks whose `seq` differ, or that finished one the others are
// still in, are the ones holding the others up.
struct OpProgress {
  std::string group;  // the communicator's name ("job/g0", "job/g0/sub3.0")
  std::string op;     // "allreduce", "barrier", ...; "" before its first
  uint64_t seq = 0;   // its place in that communicator's order
  int64_t bytes = 0;
  bool done = true;
  // When it was first seen in this state, started or finished (the real steady clock): late
  // by at most the time since the previous look, so ask regularly (a heartbeat does).
  TimePoint since{};
  // Its newest operations (up to kOpHistory), oldest first; the last is the one above. One
  // being rewritten at the moment of the look is left out.
  std::vector<OpRecord> recent;
};

class Communicator {
 public:
  // Publishes this rank's host in the store, learns everyone's, and builds the links (one
  // shm transport among the ranks of each host, TCP between hosts, per options.transport)
  // and, when every rank is on one host, the direct shared-memory engine. Blocks up to
  // connect_timeout (kDeadlineExceeded naming the missing ranks). kInvalidArgument for bad
  // options (rank outside [0, size), no store, empty group, kShm over several hosts).
  static Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options);

  // Stops the worker thread; queued operations fail with kCancelled. Peers see this rank
  // leave (their pending operations with it fail). Sub-groups must be destroyed first.
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& group() const = 0;
  // Host index of every rank (equal index = same host), in rank order.
  virtual const std::vector<int>& hosts() const = 0;

  // Collectives on `count` elements of `type` in `data` (host memory, in place; see
  // comm/collectives.h for the chunking of ReduceScatter and Allgather). `data` must stay
  // valid and untouched until the Work completes.
  virtual Result<std::shared_ptr<Work>> Allreduce(std::span<std::byte> data, size_t count,
                                                  hal::DataType type, ReduceOp op,
                                                  const OpOptions& options = {}) = 0;
  virtual Result<std::shared_ptr<Work>> ReduceScatter(std::span<std::byte> data, size_t count,
                                                      hal::DataType type, ReduceOp op,
                                                      const OpOptions& options = {}) = 0;
  virtual Result<std::shared_ptr<Work>> Allgather(std::span<std::byte> data, size_t count,
                                                  hal::DataType type,
                                                  const OpOptions& options = {}) = 0;
  // Copies root's bytes into every rank's data (every rank passes the same size).
  virtual Result<std::shared_ptr<Work>> Broadcast(std::span<std::byte> data, int root,
                                                  const OpOptions& options = {}) = 0;
  // The reduction lands in root's data; the other ranks' data is left unchanged.
  virtual Result<std::shared_ptr<Work>> Reduce(std::span<std::byte> data, size_t count,
                                               hal::DataType type, ReduceOp op, int root,
                                               const OpOptions& options = {}) = 0;
  virtual Result<std::shared_ptr<Work>> Barrier(const OpOptions& options = {}) = 0;

  // Point to point, outside the collective order: posted to the link at once. Messages from
  // one rank to another with one tag arrive in order. tag < 2^40.
  virtual Result<std::shared_ptr<Work>> Send(int peer, std::span<const std::byte> data,
                                             uint64_t tag = 0, const OpOptions& options = {}) = 0;
  virtual Result<std::shared_ptr<Work>> Recv(int peer, std::span<std::byte> data, uint64_t tag = 0,
                                             const OpOptions& options = {}) = 0;

  // Typed conveniences.
  template <typename T>
  Result<std::shared_ptr<Work>> Allreduce(std::span<T> data, ReduceOp op,
                                          const OpOptions& options = {}) {
    return Allreduce(std::as_writable_bytes(data), data.size(), hal::DataTypeOf<T>::value, op,
                     options);
  }

  // MPI_Comm_split: every rank of this communicator calls it, in the same order relative
  // to the other operations. Ranks with the same color >= 0 form a new communicator, ranked
  // by (key, rank here); color < 0 returns nullptr (not a member). The new one shares this
  // one's links (no new connections) and has its own operation order and thread.
  virtual Result<std::unique_ptr<Communicator>> Split(int color, int key) = 0;
  // Like torch.distributed.new_group: every rank calls it with the same ranks (ranks of this
  // communicator, in the order that gives the new ranks); members get the new communicator,
  // the others nullptr.
  virtual Result<std::unique_ptr<Communicator>> SubGroup(std::span<const int> ranks) = 0;

  // Collective: every rank allocates the same number of bytes, in the same order. On the
  // direct shared-memory path the buffer is registered (mapped by every rank), so
  // collectives whose data lies in it avoid copies; elsewhere it is ordinary memory. The
  // buffer may outlive the communicator. 64-byte aligned.
  virtual Result<std::shared_ptr<Buffer>> Allocate(size_t bytes) = 0;

  // The algorithm kAuto picks for an all-reduce of `bytes` here (what Allreduce will run).
  virtual Algorithm ChooseAllreduce(int64_t bytes) const = 0;

  // OK, or the sticky failure.
  virtual Status status() const = 0;
  // Fails the communicator (kAborted if reason is OK), its pending operations and its
  // links, so peers fail at once instead of at their deadline. Idempotent.
  virtual void Abort(Status reason) = 0;
  virtual CommunicatorMetrics metrics() const = 0;
  // This communicator's newest operation and those of every group split from it that is still
  // alive (safe from any thread: a watchdog or heartbeat thread asks while ops run).
  virtual std::vector<OpProgress> progress() const = 0;
};

}  // namespace kc::comm
