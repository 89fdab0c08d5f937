// The direct shared-memory collective engine: one segment per rank (control lines, a
// double-buffered small area and the staging area), mapped by every peer, plus one segment
// per rank per Allocate. Synchronisation is a counter barrier on per-rank cache lines.
#include "comm/shm/shm_direct.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <string_view>
#include <utility>
#include <vector>

#include "base/layer_guard.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "comm/collectives.h"
#include "comm/internal/shm_segment.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KC_SHMD_CPU_RELAX() _mm_pause()
#else
#define KC_SHMD_CPU_RELAX() \
  do {                      \
  } while (false)
#endif

namespace kc::comm {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMagic = 0x4b43'5348'4d44'0001ull;  // "KC" "SHMD" v1
constexpr int64_t kPageBytes = 4096;
constexpr int64_t kHeaderBytes = kPageBytes;
constexpr size_t kBlockBytes = 32 * 1024;  // reduction block: all sources combined per block
constexpr int kMaxSize = 1024;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(50);
constexpr auto kMaxSleep = std::chrono::milliseconds(50);
constexpr auto kStorePollPeriod = std::chrono::milliseconds(50);

enum SegmentState : uint32_t { kOpen = 0, kAborted = 2 };

enum class Kind : uint8_t {
  kBarrier = 1,
  kAllreduce = 2,
  kReduceScatter = 3,
  kAllgather = 4,
  kBroadcast = 5,
  kReduce = 6,
};

std::string_view KindName(Kind k) {
  switch (k) {
    case Kind::kBarrier:
      return "barrier";
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
  }
  return "unknown";
}

static_assert(std::atomic<uint64_t>::is_always_lock_free && sizeof(std::atomic<uint64_t>) == 8);
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4);

// What a rank is doing in its current collective; written before the first arrival of the
// collective, read by peers after it. Two slots, alternating by collective index.
struct OpDesc {
  uint64_t count;   // elements (bytes for broadcast)
  uint64_t offset;  // byte offset of the data in region `region`
  uint32_t region;  // allocation number (1-based) holding the data; 0: user buffer (staging)
  uint16_t root;
  uint8_t kind;     // Kind
  uint8_t type_op;  // dtype << 4 | op
};
static_assert(sizeof(OpDesc) == 24);

// At offset 0 of a rank's segment. Written once by the owner before its name is published,
// except the atomics and desc.
struct SegmentHeader {
  uint64_t magic;
  int32_t rank;
  int32_t size;
  int32_t pid;
  int32_t reserved;
  int64_t staging_bytes;
  int64_t small_bytes;
  // One line: peers poll seq and read desc with the same miss.
  alignas(64) std::atomic<uint64_t> seq;    // arrivals so far; only the owner writes it
  OpDesc desc[2];                           // [collective index % 2]
  alignas(64) std::atomic<uint32_t> state;  // SegmentState
  std::atomic<int32_t> failed_by;           // before state = aborted: the rank that failed first
  // Used in rank 0's segment only: the group's one futex word.
  alignas(64) std::atomic<uint32_t> wake_word;  // bumped by arrivals that find sleepers
  std::atomic<uint32_t> sleepers;               // ranks (about to be) asleep on wake_word
};
static_assert(sizeof(SegmentHeader) <= 256);

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

int64_t SmallOffset() { return kHeaderBytes; }
int64_t StagingOffset(int64_t small_bytes) {
  return kHeaderBytes + RoundUp(2 * small_bytes, kPageBytes);
}
int64_t SegmentBytes(int64_t small_bytes, int64_t staging_bytes) {
  return StagingOffset(small_bytes) + RoundUp(staging_bytes, kPageBytes);
}

using internal::CreateSegment;
using internal::FutexWait;
using internal::FutexWakeAll;
using internal::MapExisting;
using internal::Mapping;
using internal::NewSegment;
using internal::ProcessDead;
using internal::RandomHex;

std::string SegmentPrefix(std::string_view group) {
  return internal::SegmentPrefix("/kc-shmd-", group);
}

// This rank's view of one allocation: every rank's copy mapped.
class RegionImpl final : public ShmRegion {
 public:
  RegionImpl(uint32_t seq, size_t bytes, int rank, std::vector<Mapping> maps)
      : seq_(seq), bytes_(bytes), rank_(rank), maps_(std::move(maps)) {}
  std::span<std::byte> data() const override { return {maps_[rank_].get(), bytes_}; }

  uint32_t seq() const { return seq_; }
  size_t bytes() const { return bytes_; }
  std::byte* base(int rank) const { return maps_[rank].get(); }
  bool Contains(const std::byte* p, size_t n) const {
    const std::byte* b = maps_[rank_].get();
    return p >= b && n <= bytes_ && static_cast<size_t>(p - b) <= bytes_ - n;
  }

 private:
  // Immutable after construction.
  const uint32_t seq_;
  const size_t bytes_;
  const int rank_;
  const std::vector<Mapping> maps_;  // [rank]
};

// One collective as the engine runs it.
struct Op {
  Kind kind;
  std::span<std::byte> data;
  size_t count = 0;  // elements (bytes for broadcast)
  size_t esize = 1;
  hal::DataType type = hal::DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  TimePoint deadline;
};

std::string KeyOf(const ShmDirectOptions& o, std::string_view what) {
  return "kc/shmd/" + o.group + "/" + std::string(what);
}

class ShmDirectImpl final : public ShmDirectGroup {
 public:
  ShmDirectImpl(const ShmDirectOptions& options, std::vector<Mapping> maps)
      : options_(options),
        rank_(options.rank),
        size_(options.size),
        maps_(std::move(maps)),
        headers_(HeadersOf(maps_)),
        self_(headers_[rank_]),
        wake_(headers_[0]),
        tmp_(kBlockBytes),
        first_failed_by_(options.rank) {
    for (const SegmentHeader* h : headers_) pids_.push_back(h->pid);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const bool oversubscribed = cpus > 0 && std::max(size_, options.host_ranks) > cpus;
    spin_limit_ = oversubscribed ? std::min(options.spin_iterations, 64) : options.spin_iterations;
    yield_limit_ = oversubscribed ? 8 : 256;
    next_liveness_ = std::chrono::steady_clock::now() + kLivenessPeriod;
  }

  ~ShmDirectImpl() override {
    // A member that goes while peers may still wait on it fails them promptly.
    if (self_->state.load(std::memory_order_relaxed) != kAborted) {
      self_->failed_by.store(rank_, std::memory_order_relaxed);
      self_->state.store(kAborted, std::memory_order_seq_cst);
    }
    Wake();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Result<std::shared_ptr<ShmRegion>> Allocate(size_t bytes, TimePoint deadline) override;

  Status Allreduce(std::span<std::byte> data, size_t count, hal::DataType type, ReduceOp op,
                   TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
    KC_RETURN_IF_ERROR(CheckReduceArgs("shm_direct allreduce", data, count, type, op));
    return Run({.kind = Kind::kAllreduce,
                .data = data,
                .count = count,
                .esize = hal::DataTypeSize(type),
                .type = type,
                .op = op,
                .deadline = deadline});
  }

  Status ReduceScatter(std::span<std::byte> data, size_t count, hal::DataType type, ReduceOp op,
                       TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
    KC_RETURN_IF_ERROR(CheckReduceArgs("shm_direct reduce_scatter", data, count, type, op));
    return Run({.kind = Kind::kReduceScatter,
                .data = data,
                .count = count,
                .esize = hal::DataTypeSize(type),
                .type = type,
                .op = op,
                .deadline = deadline});
  }

  Status Allgather(std::span<std::byte> data, size_t count, hal::DataType type,
                   TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
    KC_RETURN_IF_ERROR(CheckBuffer("shm_direct allgather", data, count, type));
    return Run({.kind = Kind::kAllgather,
                .data = data,
                .count = count,
                .esize = hal::DataTypeSize(type),
                .type = type,
                .deadline = deadline});
  }

  Status Broadcast(std::span<std::byte> data, int root, TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
    KC_RETURN_IF_ERROR(CheckRoot("broadcast", root));
    return Run({.kind = Kind::kBroadcast,
                .data = data,
                .count = data.size(),
                .esize = 1,
                .root = root,
                .deadline = deadline});
  }

  Status Reduce(std::span<std::byte> data, size_t count, hal::DataType type, ReduceOp op, int root,
                TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
    KC_RETURN_IF_ERROR(CheckReduceArgs("shm_direct reduce", data, count, type, op));
    KC_RETURN_IF_ERROR(CheckRoot("reduce", root));
    return Run({.kind = Kind::kReduce,
                .data = data,
                .count = count,
                .esize = hal::DataTypeSize(type),
                .type = type,
                .op = op,
                .root = root,
                .deadline = deadline});
  }

  Status Barrier(TimePoint deadline) override {
    KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
    return Run({.kind = Kind::kBarrier, .deadline = deadline});
  }

  Status status() const override {
    MutexLock lock(&mu_);
    return error_;
  }

  void Abort(Status reason) override {
    if (reason.ok()) reason = AbortedError("shm_direct rank " + std::to_string(rank_) + " aborted");
    Fail(reason).IgnoreError();  // the sticky status is what callers see; nothing to return
  }

 private:
  static std::vector<SegmentHeader*> HeadersOf(const std::vector<Mapping>& maps) {
    std::vector<SegmentHeader*> out;
    for (const Mapping& m : maps) out.push_back(m.as<SegmentHeader>());
    return out;
  }

  Status CheckRoot(std::string_view what, int root) const {
    if (root < 0 || root >= size_) {
      return InvalidArgumentError("shm_direct " + std::string(what) + ": root " +
                                  std::to_string(root) + " outside [0, " + std::to_string(size_) +
                                  ")");
    }
    return OkStatus();
  }

  std::byte* SmallArea(int rank, uint64_t parity) const {
    return maps_[rank].get() + SmallOffset() + parity * options_.small_bytes;
  }
  std::byte* Staging(int rank) const {
    return maps_[rank].get() + StagingOffset(options_.small_bytes);
  }

  // Records the first failure (sticky), tells the peers, and returns the sticky status.
  Status Fail(const Status& s) {
    Status first;
    {
      MutexLock lock(&mu_);
      if (error_.ok()) error_ = s;
      first = error_;
    }
    failed_.store(true, std::memory_order_release);
    if (self_->state.load(std::memory_order_relaxed) != kAborted) {
      self_->failed_by.store(first_failed_by_.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
    }
    self_->state.store(kAborted, std::memory_order_seq_cst);
    Wake();
    return first;
  }

  // Wakes every rank asleep on the group's futex word. The seq_cst bump and load pair with a
  // sleeper's seq_cst increment of sleepers and load of wake_word (see WaitAll).
  void Wake() {
    wake_->wake_word.fetch_add(1, std::memory_order_seq_cst);
    if (wake_->sleepers.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&wake_->wake_word);
  }

  Status Run(const Op& o) {
    if (failed_.load(std::memory_order_acquire)) return status();
    if (size_ == 1 || (o.kind != Kind::kBarrier && o.count == 0)) return OkStatus();
    ++op_index_;
    const bool small = o.count * o.esize <= static_cast<size_t>(options_.small_bytes);
    Status s = small ? RunSmall(o) : RunLarge(o);
    held_.clear();
    if (s.ok()) return s;
    return Fail(s.WithContext("shm_direct " + std::string(KindName(o.kind)) + " op=" +
                              std::to_string(op_index_) + " rank=" + std::to_string(rank_)));
  }

  // Publishes this rank's descriptor of the current collective (read by peers after the
  // collective's first arrival).
  void PostDesc(const Op& o, uint32_t region, uint64_t offset) {
    self_->desc[op_index_ & 1] = OpDesc{
        .count = o.count,
        .offset = offset,
        .region = region,
        .root = static_cast<uint16_t>(o.root),
        .kind = static_cast<uint8_t>(o.kind),
        .type_op =
            static_cast<uint8_t>(static_cast<uint8_t>(o.type) << 4 | static_cast<uint8_t>(o.op)),
    };
  }

  // After the first arrival: every peer called the same collective.
  Status CheckDescs() {
    const OpDesc& mine = self_->desc[op_index_ & 1];
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const OpDesc& d = headers_[p]->desc[op_index_ & 1];
      if (d.kind != mine.kind || d.count != mine.count || d.type_op != mine.type_op ||
          d.root != mine.root) {
        // A failed peer's descriptor is stale: report its failure instead.
        KC_RETURN_IF_ERROR(CheckPeers());
        auto describe = [](const OpDesc& x) {
          return std::string(KindName(static_cast<Kind>(x.kind))) +
                 " count=" + std::to_string(x.count) + " type_op=" + std::to_string(x.type_op) +
                 " root=" + std::to_string(x.root);
        };
        return InvalidArgumentError("ranks called different collectives: rank " +
                                    std::to_string(p) + " " + describe(d) + ", rank " +
                                    std::to_string(rank_) + " " + describe(mine));
      }
    }
    return OkStatus();
  }

  // Arrives at the next barrier and waits for every peer to arrive at it too.
  Status Sync(const Op& o) {
    const uint64_t target = ++epoch_;
    // seq_cst: ordered before the load of sleepers (see Wake); it also releases every write
    // this rank made before, which peers acquire when they see the new value.
    self_->seq.store(target, std::memory_order_seq_cst);
    if (wake_->sleepers.load(std::memory_order_seq_cst) != 0) {
      wake_->wake_word.fetch_add(1, std::memory_order_seq_cst);
      FutexWakeAll(&wake_->wake_word);
    }
    return WaitAll(target, o);
  }

  Status WaitAll(uint64_t target, const Op& o) {
    int p = 0;  // every rank below p has arrived
    auto arrived = [&] {
      for (; p < size_; ++p) {
        // Acquire: the peer's writes before its arrival (data, desc) are visible.
        if (p != rank_ && headers_[p]->seq.load(std::memory_order_acquire) < target) return false;
      }
      return true;
    };
    if (arrived()) return OkStatus();
    int64_t polls = 0;
    for (;;) {
      if (polls < spin_limit_) {
        for (int i = 0; i < 64 && polls < spin_limit_; ++i, ++polls) {
          KC_SHMD_CPU_RELAX();
          if (arrived()) return OkStatus();
        }
        KC_RETURN_IF_ERROR(Check(o.deadline, p));
        continue;
      }
      if (polls < spin_limit_ + yield_limit_) {
        ++polls;
        sched_yield();
        if (arrived()) return OkStatus();
        KC_RETURN_IF_ERROR(Check(o.deadline, p));
        continue;
      }
      // Sleep: announce it, then re-check, so an arrival either sees us or we see it.
      wake_->sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t word = wake_->wake_word.load(std::memory_order_seq_cst);
      if (!arrived() && !failed_.load(std::memory_order_acquire)) {
        auto sleep = std::chrono::duration_cast<std::chrono::nanoseconds>(kMaxSleep);
        const auto left = o.deadline - options_.clock->Now();
        if (left < sleep) sleep = std::max<std::chrono::nanoseconds>(left, 100us);
        FutexWait(&wake_->wake_word, word, sleep.count());
      }
      wake_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (arrived()) return OkStatus();
      KC_RETURN_IF_ERROR(Check(o.deadline, p));
    }
  }

  // Between polls: this rank's own failure (Abort from another thread), peers that failed or
  // died, and the deadline. `waiting_for`: a rank that has not arrived.
  Status Check(TimePoint deadline, int waiting_for) {
    KC_RETURN_IF_ERROR(CheckPeers());
    if (options_.clock->Now() >= deadline) {
      return DeadlineExceededError("deadline exceeded waiting for rank " +
                                   std::to_string(waiting_for));
    }
    return OkStatus();
  }

  // kAborted for peer q, which failed (acquired: its failed_by is visible), naming the rank
  // whose failure started it; remembered so this rank's own failure names it too.
  Status PeerFailed(int q) {
    int origin = headers_[q]->failed_by.load(std::memory_order_relaxed);
    if (origin < 0 || origin >= size_) origin = q;
    int expected = rank_;
    first_failed_by_.compare_exchange_strong(expected, origin, std::memory_order_relaxed);
    if (origin == q) return AbortedError("peer rank " + std::to_string(q) + " aborted or failed");
    return AbortedError("peer rank " + std::to_string(origin) +
                        " aborted or failed (seen via rank " + std::to_string(q) + ")");
  }

  Status CheckPeers() {
    if (failed_.load(std::memory_order_acquire)) return status();
    for (int q = 0; q < size_; ++q) {
      if (q != rank_ && headers_[q]->state.load(std::memory_order_acquire) == kAborted) {
        return PeerFailed(q);
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now < next_liveness_) return OkStatus();
    next_liveness_ = now + kLivenessPeriod;
    const pid_t me = getpid();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || pids_[q] == me || !ProcessDead(pids_[q])) continue;
      // A process that failed before it died has said so; report that instead.
      if (headers_[q]->state.load(std::memory_order_acquire) == kAborted) return PeerFailed(q);
      return UnavailableError("peer rank " + std::to_string(q) + " (pid " +
                              std::to_string(pids_[q]) + ") died");
    }
    return OkStatus();
  }

  // The region of this rank that holds `n` bytes at `p`, if any.
  std::shared_ptr<RegionImpl> FindRegion(const std::byte* p, size_t n) const {
    for (const auto& w : regions_) {
      std::shared_ptr<RegionImpl> r = w.lock();
      if (r != nullptr && r->Contains(p, n)) return r;
    }
    return nullptr;
  }

  // Where peer q's data of the current collective starts, as its descriptor says: its region
  // copy (zero-copy), or nullptr when it goes through q's staging area. Holds the region for
  // the rest of the collective.
  Result<const std::byte*> ExposedBase(int q, size_t bytes) {
    const OpDesc& d = headers_[q]->desc[op_index_ & 1];
    if (d.region == 0) return static_cast<const std::byte*>(nullptr);
    std::shared_ptr<RegionImpl> region;
    for (const auto& w : regions_) {
      std::shared_ptr<RegionImpl> r = w.lock();
      if (r != nullptr && r->seq() == d.region) region = std::move(r);
    }
    if (region == nullptr) {
      return FailedPreconditionError("rank " + std::to_string(q) + "'s data lies in region " +
                                     std::to_string(d.region) + ", which this rank has released");
    }
    if (d.offset > region->bytes() || bytes > region->bytes() - d.offset) {
      return DataLossError("rank " + std::to_string(q) + "'s data overruns region " +
                           std::to_string(d.region));
    }
    const std::byte* base = region->base(q) + d.offset;
    held_.push_back(std::move(region));
    return base;
  }

  // dst[i] (and dst2[i] unless null) = op over srcs[0..size)[i], combined in rank order, for
  // n elements; scaled by 1 / size for avg. Works in blocks so every source of a block is
  // combined while the block is in cache. dst may equal a source.
  void ReduceRange(const Op& o, std::byte* dst, std::byte* dst2, const std::byte* const* srcs,
                   size_t n) {
    const size_t block = kBlockBytes / o.esize;
    std::byte* tmp = tmp_.data();
    for (size_t at = 0; at < n; at += block) {
      const size_t m = std::min(block, n - at);
      const size_t off = at * o.esize;
      ReduceElements(o.type, o.op, tmp, srcs[0] + off, srcs[1] + off, m);
      for (int q = 2; q < size_; ++q) ReduceElements(o.type, o.op, tmp, tmp, srcs[q] + off, m);
      if (o.op == ReduceOp::kAvg) ScaleByInverse(o.type, tmp, m, size_);
      std::memcpy(dst + off, tmp, m * o.esize);
      if (dst2 != nullptr) std::memcpy(dst2 + off, tmp, m * o.esize);
    }
  }

  // At most small_bytes: one arrival. Everyone copies what peers need into its small area
  // (alternating halves), arrives, then reads the peers' small areas. The half written by
  // collective k is rewritten at k + 2 only after the arrival of k + 1, by which time every
  // peer has finished reading it.
  Status RunSmall(const Op& o) {
    const uint64_t parity = small_index_++ & 1;
    std::byte* mine = SmallArea(rank_, parity);
    std::byte* data = o.data.data();
    const size_t bytes = o.count * o.esize;
    const ChunkRange own = ChunkOf(o.count, size_, rank_);
    switch (o.kind) {
      case Kind::kAllreduce:
      case Kind::kReduceScatter:
        std::memcpy(mine, data, bytes);
        break;
      case Kind::kReduce:
        if (rank_ != o.root) std::memcpy(mine, data, bytes);
        break;
      case Kind::kAllgather:
        std::memcpy(mine + own.offset * o.esize, data + own.offset * o.esize, own.count * o.esize);
        break;
      case Kind::kBroadcast:
        if (rank_ == o.root) std::memcpy(mine, data, bytes);
        break;
      case Kind::kBarrier:
        break;
    }
    PostDesc(o, 0, 0);
    KC_RETURN_IF_ERROR(Sync(o));
    KC_RETURN_IF_ERROR(CheckDescs());
    std::vector<const std::byte*>& srcs = srcs_;
    srcs.assign(size_, nullptr);
    for (int q = 0; q < size_; ++q) srcs[q] = q == rank_ ? data : SmallArea(q, parity);
    switch (o.kind) {
      case Kind::kAllreduce:
        ReduceRange(o, data, nullptr, srcs.data(), o.count);
        break;
      case Kind::kReduceScatter: {
        for (auto& s : srcs) s += own.offset * o.esize;
        ReduceRange(o, data + own.offset * o.esize, nullptr, srcs.data(), own.count);
        break;
      }
      case Kind::kReduce:
        if (rank_ == o.root) ReduceRange(o, data, nullptr, srcs.data(), o.count);
        break;
      case Kind::kAllgather:
        for (int p = 0; p < size_; ++p) {
          if (p == rank_) continue;
          const ChunkRange c = ChunkOf(o.count, size_, p);
          std::memcpy(data + c.offset * o.esize, srcs[p] + c.offset * o.esize, c.count * o.esize);
        }
        break;
      case Kind::kBroadcast:
        if (rank_ != o.root) std::memcpy(data, srcs[o.root], bytes);
        break;
      case Kind::kBarrier:
        break;
    }
    return OkStatus();
  }

  Status RunLarge(const Op& o) {
    // Expose this rank's data: in place when it lies in a region, else through staging.
    const size_t bytes = o.count * o.esize;
    std::shared_ptr<RegionImpl> region = FindRegion(o.data.data(), bytes);
    const bool registered = region != nullptr;
    PostDesc(o, registered ? region->seq() : 0,
             registered ? static_cast<uint64_t>(o.data.data() - region->base(rank_)) : 0);
    if (registered) held_.push_back(std::move(region));
    switch (o.kind) {
      case Kind::kAllreduce:
      case Kind::kReduceScatter:
      case Kind::kAllgather:
        return RunChunked(o, registered);
      case Kind::kBroadcast:
      case Kind::kReduce:
        return RunRooted(o, registered);
      case Kind::kBarrier:
        break;
    }
    return InternalError("shm_direct: a barrier has no data");
  }

  // Resolves where each peer's data is after the collective's first arrival. A null base
  // means the peer's staging area. Only rank `only` is resolved when it is not -1.
  Status ResolveExposures(size_t bytes, int only) {
    exposed_.assign(size_, nullptr);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || (only >= 0 && q != only)) continue;
      KC_ASSIGN_OR_RETURN(exposed_[q], ExposedBase(q, bytes));
    }
    return OkStatus();
  }

  // Allreduce, reduce-scatter, allgather. Each ChunkOf chunk is cut into slices of
  // `per` elements, so that slice i of every chunk fits staging sub-area [chunk] of
  // every rank. Staging sub-area p holds the current slice of chunk p.
  Status RunChunked(const Op& o, bool registered) {
    const int n = size_;
    const int r = rank_;
    const size_t es = o.esize;
    const size_t per = static_cast<size_t>(options_.staging_bytes) / es / n;
    std::vector<ChunkRange> chunk(n);
    for (int p = 0; p < n; ++p) chunk[p] = ChunkOf(o.count, n, p);
    std::byte* data = o.data.data();
    std::byte* my_staging = Staging(r);
    // Slice i of chunk p: elements [chunk[p].offset + lo, + Part(p)).
    auto part = [&](int p, size_t lo) {
      return lo >= chunk[p].count ? size_t{0} : std::min(per, chunk[p].count - lo);
    };
    auto exposed = [&](int q, int p, size_t lo) -> const std::byte* {
      if (exposed_[q] == nullptr) return Staging(q) + p * per * es;
      return exposed_[q] + (chunk[p].offset + lo) * es;
    };
    auto at = [&](int p, size_t lo) { return data + (chunk[p].offset + lo) * es; };
    srcs_.assign(n, nullptr);
    for (size_t lo = 0; lo < chunk[0].count; lo += per) {
      // 1. Expose the parts peers will read (user buffers: copy them into staging).
      if (!registered) {
        for (int p = 0; p < n; ++p) {
          const bool needed = o.kind == Kind::kAllgather ? p == r : p != r;
          if (needed && part(p, lo) > 0) {
            std::memcpy(my_staging + p * per * es, at(p, lo), part(p, lo) * es);
          }
        }
      }
      // 2. Every rank's inputs for this slice are ready.
      KC_RETURN_IF_ERROR(Sync(o));
      if (lo == 0) {
        KC_RETURN_IF_ERROR(CheckDescs());
        KC_RETURN_IF_ERROR(ResolveExposures(o.count * es, -1));
      }
      if (o.kind == Kind::kAllgather) {
        // 3. Copy every peer's part straight into place.
        for (int p = 0; p < n; ++p) {
          if (p != r && part(p, lo) > 0)
            std::memcpy(at(p, lo), exposed(p, p, lo), part(p, lo) * es);
        }
        // 4. Nobody rewrites its staging or data while a peer still reads it.
        KC_RETURN_IF_ERROR(Sync(o));
        continue;
      }
      // 3. Reduce this rank's part of its chunk from every rank's copy, in rank order; for
      // allreduce through staging, leave the result in staging too for the peers to read.
      if (part(r, lo) > 0) {
        for (int q = 0; q < n; ++q) srcs_[q] = q == r ? at(r, lo) : exposed(q, r, lo);
        std::byte* dst2 =
            o.kind == Kind::kAllreduce && !registered ? my_staging + r * per * es : nullptr;
        ReduceRange(o, at(r, lo), dst2, srcs_.data(), part(r, lo));
      }
      // 4. Every part is reduced (reduce-scatter: and read; done with this slice).
      KC_RETURN_IF_ERROR(Sync(o));
      if (o.kind == Kind::kReduceScatter) continue;
      // 5. Copy every peer's reduced part into place.
      for (int p = 0; p < n; ++p) {
        if (p != r && part(p, lo) > 0) std::memcpy(at(p, lo), exposed(p, p, lo), part(p, lo) * es);
      }
      // 6. Nobody rewrites its staging or data while a peer still reads it.
      KC_RETURN_IF_ERROR(Sync(o));
    }
    return OkStatus();
  }

  // Broadcast and reduce, in slices of staging_bytes.
  Status RunRooted(const Op& o, bool registered) {
    const int r = rank_;
    const size_t es = o.esize;
    const size_t per = static_cast<size_t>(options_.staging_bytes) / es;
    std::byte* data = o.data.data();
    srcs_.assign(size_, nullptr);
    for (size_t lo = 0; lo < o.count; lo += per) {
      const size_t m = std::min(per, o.count - lo);
      // 1. Expose: the root's bytes (broadcast) or every non-root's input (reduce).
      const bool exposes = o.kind == Kind::kBroadcast ? r == o.root : r != o.root;
      if (exposes && !registered) std::memcpy(Staging(r), data + lo * es, m * es);
      KC_RETURN_IF_ERROR(Sync(o));
      if (lo == 0) {
        KC_RETURN_IF_ERROR(CheckDescs());
        if (o.kind == Kind::kBroadcast && r != o.root) {
          KC_RETURN_IF_ERROR(ResolveExposures(o.count * es, o.root));
        } else if (o.kind == Kind::kReduce && r == o.root) {
          KC_RETURN_IF_ERROR(ResolveExposures(o.count * es, -1));
        }
      }
      auto exposed = [&](int q) -> const std::byte* {
        return exposed_[q] == nullptr ? Staging(q) : exposed_[q] + lo * es;
      };
      // 2. Non-roots copy the root's slice (broadcast); the root reduces all (reduce).
      if (o.kind == Kind::kBroadcast && r != o.root) {
        std::memcpy(data + lo * es, exposed(o.root), m * es);
      } else if (o.kind == Kind::kReduce && r == o.root) {
        for (int q = 0; q < size_; ++q) srcs_[q] = q == r ? data + lo * es : exposed(q);
        ReduceRange(o, data + lo * es, nullptr, srcs_.data(), m);
      }
      // 3. Nobody rewrites its staging or data while a peer still reads it.
      KC_RETURN_IF_ERROR(Sync(o));
    }
    return OkStatus();
  }

  // Waits for `keys` in the store until `store_deadline` (on the store's clock), checking
  // the peers between slices of kStorePollPeriod so an abort or death ends it early.
  Status StoreWait(const std::vector<std::string>& keys, TimePoint store_deadline) {
    Clock* sc = options_.store->clock();
    for (;;) {
      const TimePoint slice = std::min(store_deadline, sc->Now() + kStorePollPeriod);
      Status s = options_.store->Wait(keys, slice);
      if (s.ok() || s.code() != ErrorCode::kDeadlineExceeded || sc->Now() >= store_deadline) {
        return s;
      }
      KC_RETURN_IF_ERROR(CheckPeers());
    }
  }

  // Immutable after construction.
  const ShmDirectOptions options_;  // store and clock outlive the group (options contract)
  const int rank_;
  const int size_;
  const std::vector<Mapping> maps_;            // [rank]: every rank's segment
  const std::vector<SegmentHeader*> headers_;  // [rank], in maps_
  SegmentHeader* const self_;                  // headers_[rank_]
  SegmentHeader* const wake_;                  // headers_[0]: holds the futex word
  std::vector<pid_t> pids_;
  int64_t spin_limit_ = 0;
  int64_t yield_limit_ = 0;

  // Owned by the thread running the current collective (one at a time, see the class
  // comment).
  uint64_t epoch_ = 0;        // arrivals of this rank so far (== self_->seq)
  uint64_t op_index_ = 0;     // collectives that reached the engine
  uint64_t small_index_ = 0;  // of which took the small path
  uint32_t alloc_index_ = 0;  // Allocate calls
  std::chrono::steady_clock::time_point next_liveness_;
  std::vector<std::weak_ptr<RegionImpl>> regions_;  // allocated by this group
  std::vector<std::shared_ptr<RegionImpl>> held_;   // regions the current collective reads
  std::vector<const std::byte*> exposed_;           // [rank] see ResolveExposures
  std::vector<const std::byte*> srcs_;              // [rank] scratch for ReduceRange
  std::vector<std::byte> tmp_;                      // one reduction block

  std::atomic<bool> failed_{false};  // error_ is set; read without mu_ on fast paths
  // The rank whose failure failed this one (this rank unless a peer's did); published in
  // failed_by. Relaxed: ordered by the seq_cst store of state that follows.
  std::atomic<int> first_failed_by_;
  mutable Mutex mu_;
  Status error_ KC_GUARDED_BY(mu_);
};

Result<std::shared_ptr<ShmRegion>> ShmDirectImpl::Allocate(size_t bytes, TimePoint deadline) {
  KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
  if (bytes == 0 || bytes > (size_t{1} << 46)) {
    return InvalidArgumentError("shm_direct allocate: bad size " + std::to_string(bytes));
  }
  if (failed_.load(std::memory_order_acquire)) return status();
  const uint32_t k = ++alloc_index_;
  const std::string ctx =
      "shm_direct allocate=" + std::to_string(k) + " rank=" + std::to_string(rank_);
  auto fail = [&](const Status& s) { return Fail(s.WithContext(ctx)); };
  Clock* sc = options_.store->clock();
  const TimePoint store_deadline = sc->Now() + (deadline - options_.clock->Now());
  const int64_t map_bytes = RoundUp(static_cast<int64_t>(bytes), kPageBytes);
  auto key = [&](std::string_view what, int r) {
    return KeyOf(options_,
                 "alloc/" + std::to_string(k) + "/" + std::string(what) + "/" + std::to_string(r));
  };

  // 1. Create this rank's copy and publish its name and size.
  const std::string name = SegmentPrefix(options_.group) + "a" + std::to_string(k) + "-r" +
                           std::to_string(rank_) + "-" + RandomHex();
  Result<NewSegment> seg = CreateSegment(name, map_bytes);
  if (!seg.ok()) return fail(seg.status());
  std::vector<Mapping> maps(size_);
  maps[rank_] = std::move(seg->mapping);
  if (Status s = options_.store->Set(key("seg", rank_), name + " " + std::to_string(bytes));
      !s.ok()) {
    return fail(s);
  }
  // 2. Map every peer's copy.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::vector<std::string> keys = {key("seg", p)};
    if (Status s = StoreWait(keys, store_deadline); !s.ok()) return fail(s);
    Result<std::string> v = options_.store->Get(keys[0], store_deadline);
    if (!v.ok()) return fail(v.status());
    const size_t space = v->rfind(' ');
    if (space == std::string::npos || v->substr(space + 1) != std::to_string(bytes)) {
      return fail(InvalidArgumentError("rank " + std::to_string(p) + " allocated another size (" +
                                       *v + "), this rank " + std::to_string(bytes)));
    }
    Result<Mapping> m = MapExisting(v->substr(0, space), p, map_bytes);
    if (!m.ok()) return fail(m.status());
    maps[p] = std::move(m).value();
  }
  // 3. Once everyone mapped every copy, the names go.
  if (Status s = options_.store->Set(key("mapped", rank_), "1"); !s.ok()) return fail(s);
  std::vector<std::string> mapped;
  for (int p = 0; p < size_; ++p) mapped.push_back(key("mapped", p));
  if (Status s = StoreWait(mapped, store_deadline); !s.ok()) return fail(s);
  seg->unlink->Unlink();
  // Every peer has read the name; dropping the key keeps the store small. Best effort.
  options_.store->Delete(key("seg", rank_)).IgnoreError();

  auto region = std::make_shared<RegionImpl>(k, bytes, rank_, std::move(maps));
  std::erase_if(regions_, [](const std::weak_ptr<RegionImpl>& w) { return w.expired(); });
  regions_.push_back(region);
  return std::shared_ptr<ShmRegion>(std::move(region));
}

}  // namespace

Result<std::unique_ptr<ShmDirectGroup>> ShmDirectGroup::Create(const ShmDirectOptions& o) {
  KC_LAYER_ENTRY(Layer::kComm, "shm_direct");
  if (o.store == nullptr || o.clock == nullptr || o.group.empty() || o.size < 1 ||
      o.size > kMaxSize || o.rank < 0 || o.rank >= o.size || o.staging_bytes < 4096 ||
      o.staging_bytes < 64 * int64_t{o.size} || o.staging_bytes > (int64_t{1} << 40) ||
      o.small_bytes < 0 || o.small_bytes > o.staging_bytes || o.spin_iterations < 0 ||
      o.host_ranks < 0) {
    return InvalidArgumentError("shm_direct: bad options for group " + o.group + " rank " +
                                std::to_string(o.rank) + " of " + std::to_string(o.size));
  }
  const TimePoint deadline = o.store->clock()->Now() + o.connect_timeout;
  const int64_t bytes = SegmentBytes(o.small_bytes, o.staging_bytes);
  auto key = [&](std::string_view what, int r) {
    return KeyOf(o, std::string(what) + "/" + std::to_string(r));
  };

  // 1. Create and initialise this rank's segment under an unguessable name.
  const std::string name =
      SegmentPrefix(o.group) + "r" + std::to_string(o.rank) + "-" + RandomHex();
  KC_ASSIGN_OR_RETURN(NewSegment seg, CreateSegment(name, bytes));
  SegmentHeader* h = new (seg.mapping.get()) SegmentHeader{};
  h->magic = kMagic;
  h->rank = o.rank;
  h->size = o.size;
  h->pid = getpid();
  h->staging_bytes = o.staging_bytes;
  h->small_bytes = o.small_bytes;
  std::vector<Mapping> maps(o.size);
  maps[o.rank] = std::move(seg.mapping);

  // 2. Publish its name, then map every peer's.
  KC_RETURN_IF_ERROR(o.store->Set(key("seg", o.rank), name));
  for (int p = 0; p < o.size; ++p) {
    if (p == o.rank) continue;
    KC_ASSIGN_OR_RETURN(std::string peer_name, o.store->Get(key("seg", p), deadline));
    KC_ASSIGN_OR_RETURN(maps[p], MapExisting(peer_name, p, bytes));
    const SegmentHeader* ph = maps[p].as<SegmentHeader>();
    if (ph->magic != kMagic || ph->rank != p || ph->size != o.size ||
        ph->staging_bytes != o.staging_bytes || ph->small_bytes != o.small_bytes) {
      return DataLossError("shm segment " + peer_name + " does not match rank " +
                           std::to_string(p) + " of this group");
    }
  }

  // 3. Once every rank has mapped every segment, nobody needs the names any more.
  KC_RETURN_IF_ERROR(o.store->Set(key("mapped", o.rank), "1"));
  std::vector<std::string> mapped;
  for (int p = 0; p < o.size; ++p) mapped.push_back(key("mapped", p));
  KC_RETURN_IF_ERROR(o.store->Wait(mapped, deadline));
  seg.unlink->Unlink();
  return std::unique_ptr<ShmDirectGroup>(std::make_unique<ShmDirectImpl>(o, std::move(maps)));
}

}  // namespace kc::comm
