// The communicator: links and engines built at Create, an operation queue drained by a
// worker thread (or by a thread waiting on one of its operations), and the per-operation
// algorithm choice. Design: docs/design/collectives.md.
#include "comm/communicator.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "base/layer_guard.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "comm/internal/routing_transport.h"
#include "comm/shm/shm_direct.h"
#include "comm/shm/shm_transport.h"
#include "comm/subgroup_transport.h"
#include "comm/tcp/tcp_transport.h"

namespace kc::comm {
namespace {

// Tags: point-to-point user tags are below 2^40; collectives use kCollectiveTag | sequence.
// Sub-group views put their salt above bit 48 (comm/subgroup_transport.h).
constexpr uint64_t kUserTagLimit = uint64_t{1} << 40;
constexpr uint64_t kCollectiveTag = uint64_t{1} << 40;
// A group with salt s (the root: 0) uses s + 1 for its view over the host leaders and s + 2
// for its views inside each host (hosts are disjoint, so one salt serves them all).
constexpr int kSaltsPerGroup = 3;
constexpr int kFirstSplitSalt = kSaltsPerGroup;
// Salts from here up are AllreduceHierarchical's (comm/collectives.h).
constexpr int kSaltLimit = 0xFFF0;
// The worker's poll period while operations keep coming, and how long after the last one it
// goes to sleep (see OpQueue).
constexpr auto kPollPeriod = std::chrono::milliseconds(1);
constexpr auto kIdleAfter = std::chrono::milliseconds(20);
// How long Wait() waits past an operation's deadline for the operation to report its own
// (more precise) error before it gives up with a generic one.
constexpr auto kWaitGrace = std::chrono::seconds(1);

// ---------------------------------------------------------------------------------------
// The operation queue.

struct Op {
  std::function<Status()> run;
  TimePoint deadline;
  std::optional<Status> result;  // guarded by the queue's mutex
};

// FIFO of operations run one at a time, by the worker thread or by a thread waiting on an
// operation (which then runs the queue's front itself: a blocking caller pays no thread
// hand-off).
//
// The worker is not woken per operation: waking a thread per call costs more than a small
// collective on shared memory, and on a small host the woken thread preempts a rank in the
// middle of one. While operations keep coming the worker polls every kPollPeriod and takes
// an operation that stayed unclaimed for a whole period (nobody is waiting on it: an
// asynchronous caller); after kIdleAfter without operations it sleeps until the next push.
class OpQueue {
 public:
  explicit OpQueue(Clock* clock) : clock_(clock), worker_([this] { WorkerLoop(); }) {}
  ~OpQueue() { Shutdown(); }

  // Fails the queued operations with kCancelled, lets a running one finish and joins the
  // worker. Later pushes fail at once. Idempotent; not concurrent with itself.
  void Shutdown() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      for (const auto& op : queue_) op->result = CancelledError("communicator destroyed");
      queue_.clear();
      done_.SignalAll();
      worker_cv_.Signal();
    }
    if (worker_.joinable()) worker_.join();
  }

  void Push(std::shared_ptr<Op> op) {
    MutexLock lock(&mu_);
    if (stop_) {
      op->result = CancelledError("communicator destroyed");
      return;
    }
    queue_.push_back(std::move(op));
    last_push_ = std::chrono::steady_clock::now();
    if (worker_idle_) worker_cv_.Signal();
  }

  // Waits until `op` completes or `deadline` passes (nullopt). With run_queued, runs queued
  // operations on this thread while none is running: only for a caller prepared to block
  // for as long as they take (each is bounded by its own deadline).
  std::optional<Status> WaitFor(Op* op, TimePoint deadline, bool run_queued) {
    MutexLock lock(&mu_);
    while (!op->result.has_value()) {
      if (run_queued && !running_ && !queue_.empty()) {
        RunFront();
        continue;
      }
      if (clock_->Now() >= deadline) return std::nullopt;
      clock_->WaitUntil(&done_, &mu_, deadline);
    }
    return op->result;
  }

  std::optional<Status> Test(Op* op) {
    MutexLock lock(&mu_);
    return op->result;
  }

 private:
  // Real time throughout: the communicator's clock may be a fake one.
  void WorkerLoop() {
    MutexLock lock(&mu_);
    const Op* seen = nullptr;  // the unclaimed front at the previous poll
    while (!stop_) {
      const auto now = std::chrono::steady_clock::now();
      if (!running_ && !queue_.empty()) {
        if (queue_.front().get() == seen) {  // unclaimed for a whole period
          seen = nullptr;
          RunFront();
          continue;
        }
        seen = queue_.front().get();
      } else {
        seen = nullptr;
      }
      if (queue_.empty() && !running_ && now - last_push_ > kIdleAfter) {
        worker_idle_ = true;
        while (!stop_ && queue_.empty()) worker_cv_.Wait(&mu_);
        worker_idle_ = false;
        continue;  // a push: poll from now
      }
      worker_cv_.WaitUntil(&mu_, now + kPollPeriod);
    }
  }

  // Pops the front and runs it with mu_ released.
  void RunFront() KC_REQUIRES(mu_) {
    std::shared_ptr<Op> op = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    mu_.Unlock();
    Status s = op->run();
    op->run = nullptr;  // drop captured buffers now
    mu_.Lock();
    running_ = false;
    op->result = std::move(s);
    done_.SignalAll();
  }

  Clock* const clock_;
  Mutex mu_;
  CondVar done_;       // an operation completed (waiters)
  CondVar worker_cv_;  // a push to an idle worker, or shutdown
  std::deque<std::shared_ptr<Op>> queue_ KC_GUARDED_BY(mu_);
  bool running_ KC_GUARDED_BY(mu_) = false;
  bool stop_ KC_GUARDED_BY(mu_) = false;
  bool worker_idle_ KC_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_push_ KC_GUARDED_BY(mu_);
  std::thread worker_;  // last: starts after the fields above exist
};

class QueuedWork final : public Work {
 public:
  QueuedWork(std::shared_ptr<OpQueue> queue, std::shared_ptr<Op> op)
      : queue_(std::move(queue)), op_(std::move(op)) {}
  Status Wait() override {
    std::optional<Status> s =
        queue_->WaitFor(op_.get(), op_->deadline + kWaitGrace, /*run_queued=*/true);
    if (!s.has_value()) return DeadlineExceededError("communicator: operation past its deadline");
    return *s;
  }
  Status Wait(TimePoint deadline) override {
    std::optional<Status> s =
        queue_->WaitFor(op_.get(), deadline, /*run_queued=*/deadline >= op_->deadline);
    if (!s.has_value()) return DeadlineExceededError("communicator: operation still pending");
    return *s;
  }
  std::optional<Status> Test() override { return queue_->Test(op_.get()); }

 private:
  std::shared_ptr<OpQueue> queue_;
  std::shared_ptr<Op> op_;
};

// A Work that is done from the start (a failed submission on a failed communicator).
class DoneWork final : public Work {
 public:
  explicit DoneWork(Status s) : s_(std::move(s)) {}
  Status Wait() override { return s_; }
  Status Wait(TimePoint) override { return s_; }
  std::optional<Status> Test() override { return s_; }

 private:
  Status s_;
};

// ---------------------------------------------------------------------------------------
// Buffers.

class HeapBuffer final : public Buffer {
 public:
  explicit HeapBuffer(size_t bytes)
      : bytes_(bytes),
        data_(static_cast<std::byte*>(
            ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{64}))) {
    std::memset(data_, 0, bytes_);
  }
  ~HeapBuffer() override { ::operator delete (data_, std::align_val_t{64}); }
  std::span<std::byte> bytes() override { return {data_, bytes_}; }

 private:
  size_t bytes_;
  std::byte* data_;
};

class RegionBuffer final : public Buffer {
 public:
  explicit RegionBuffer(std::shared_ptr<ShmRegion> region) : region_(std::move(region)) {}
  std::span<std::byte> bytes() override { return region_->data(); }

 private:
  std::shared_ptr<ShmRegion> region_;
};

// ---------------------------------------------------------------------------------------
// State shared by a root communicator and every sub-group made from it on this rank.

// The coarse monotonic clock (vDSO, no system call, a few nanoseconds), in steady_clock
// ticks: steady_clock is CLOCK_MONOTONIC, and the coarse clock is that clock read at the last
// tick.
int64_t CoarseNowTicks() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec))
      .count();
}

// One communicator's newest operations (Communicator::progress), written by its worker thread
// on every operation: relaxed stores, no lock, two reads of the coarse clock (a few
// nanoseconds each). Each entry of the ring is read whole or left out (one being rewritten at
// the moment of the look). The newest operation is the ring's newest entry; when a reader first
// sees it in a state (entered or finished) it stamps `since`, late by at most the time between
// two looks (a heartbeat period).
class ProgressSlot {
 public:
  explicit ProgressSlot(std::string group) : group_(std::move(group)) {}
  void Enter(const char* op, uint64_t seq, int64_t bytes) {
    current_ = seq;
    Entry& e = ring_[seq % kOpHistory];
    const uint64_t v = BeginWrite(e);
    e.op.store(op, std::memory_order_relaxed);
    e.seq.store(seq, std::memory_order_relaxed);
    e.bytes.store(bytes, std::memory_order_relaxed);
    e.start.store(CoarseNowTicks(), std::memory_order_relaxed);
    e.end.store(kNotEnded, std::memory_order_relaxed);
    e.version.store(v + 2, std::memory_order_release);
  }
  void Leave() {
    Entry& e = ring_[current_ % kOpHistory];
    const uint64_t v = BeginWrite(e);
    e.end.store(CoarseNowTicks(), std::memory_order_relaxed);
    e.version.store(v + 2, std::memory_order_release);
  }
  OpProgress Get() const {
    OpProgress p{.group = group_, .recent = Recent()};
    if (!p.recent.empty()) {
      const OpRecord& newest = p.recent.back();
      p.op = newest.op;
      p.seq = newest.seq;
      p.bytes = newest.bytes;
      p.done = newest.end.has_value();
    }
    const uint64_t state = p.seq * 2 + (p.done ? 1 : 0) + 1;  // 0: never looked at
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    if (seen_state_.exchange(state, std::memory_order_relaxed) != state) {
      seen_at_.store(now, std::memory_order_relaxed);
    }
    p.since =
        TimePoint(std::chrono::steady_clock::duration(seen_at_.load(std::memory_order_relaxed)));
    return p;
  }

 private:
  static constexpr int64_t kNotEnded = -1;
  // A seqlock: `version` is odd while the single writer rewrites the entry, and a reader keeps
  // what it read only when the version was even and the same before and after.
  struct Entry {
    std::atomic<uint64_t> version{0};
    std::atomic<const char*> op{nullptr};  // nullptr: never written
    std::atomic<uint64_t> seq{0};
    std::atomic<int64_t> bytes{0};
    std::atomic<int64_t> start{0};  // steady_clock ticks
    std::atomic<int64_t> end{kNotEnded};
  };

  static uint64_t BeginWrite(Entry& e) {
    const uint64_t v = e.version.load(std::memory_order_relaxed);
    e.version.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    return v;
  }

  std::vector<OpRecord> Recent() const {
    std::vector<OpRecord> out;
    out.reserve(kOpHistory);
    for (const Entry& e : ring_) {
      const uint64_t v = e.version.load(std::memory_order_acquire);
      if (v % 2 != 0) continue;
      const char* op = e.op.load(std::memory_order_relaxed);
      OpRecord r{.seq = e.seq.load(std::memory_order_relaxed),
                 .bytes = e.bytes.load(std::memory_order_relaxed),
                 .start = TimePoint(Duration(e.start.load(std::memory_order_relaxed)))};
      const int64_t end = e.end.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (op == nullptr || e.version.load(std::memory_order_relaxed) != v) continue;
      r.op = op;
      if (end != kNotEnded) r.end = TimePoint(Duration(end));
      out.push_back(std::move(r));
    }
    std::sort(out.begin(), out.end(),
              [](const OpRecord& a, const OpRecord& b) { return a.seq < b.seq; });
    return out;
  }

  const std::string group_;
  uint64_t current_ = 0;  // the operation being run (the writer's alone)
  mutable std::atomic<uint64_t> seen_state_{0};
  mutable std::atomic<int64_t> seen_at_{0};  // steady_clock ticks
  Entry ring_[kOpHistory];
};

struct Root {
  CommunicatorOptions options;           // of the root; group and store reused by sub-groups
  std::shared_ptr<Transport> transport;  // over every root rank
  std::vector<int> hosts;                // host index of every root rank
  Mutex mu;
  int next_salt KC_GUARDED_BY(mu) = kFirstSplitSalt;
  // Every communicator of the tree, for progress(): gone ones expire.
  std::vector<std::weak_ptr<ProgressSlot>> slots KC_GUARDED_BY(mu);
};

// Everything one communicator runs on.
struct Links {
  std::shared_ptr<Transport> transport;  // this group's ranks
  std::vector<int> hosts;                // host index per rank of this group
  // Every rank on one host over shared memory: the direct engine for the whole group.
  std::unique_ptr<ShmDirectGroup> direct;
  // Several hosts: among this host's ranks (when it has more than one) the direct engine
  // (shared memory allowed) or else a view of the transport; and the view over the host
  // leaders (for leaders only).
  std::unique_ptr<ShmDirectGroup> local;
  std::shared_ptr<Transport> local_view;
  std::shared_ptr<Transport> leaders;
  int num_hosts = 1;
  bool some_host_shared = false;  // several hosts, and some host has more than one rank
};

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string Join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Each rank's device in `topology` from the host it runs on: the ranks of a host, in rank
// order, take that host's devices in the topology's order. kInvalidArgument naming the rank
// when its host is not in the topology or has fewer devices than ranks.
Result<std::vector<int>> DevicesByHost(const hal::Topology& topology,
                                       const std::vector<std::string>& host_names) {
  std::map<std::string, std::vector<int>> free;
  for (size_t h = 0; h < topology.hosts().size(); ++h) free[topology.hosts()[h].name];
  for (int d = 0; d < topology.num_devices(); ++d) {
    free[topology.hosts()[static_cast<size_t>(topology.host_of(d))].name].push_back(d);
  }
  for (auto& [name, devices] : free) std::reverse(devices.begin(), devices.end());
  std::vector<int> out;
  for (size_t r = 0; r < host_names.size(); ++r) {
    auto it = free.find(host_names[r]);
    if (it == free.end()) {
      return InvalidArgumentError("rank " + std::to_string(r) + " runs on host " + host_names[r] +
                                  ", which topology " + topology.name() + " does not have");
    }
    if (it->second.empty()) {
      return InvalidArgumentError("rank " + std::to_string(r) + ": host " + host_names[r] +
                                  " of topology " + topology.name() +
                                  " has fewer devices than the ranks that run on it");
    }
    out.push_back(it->second.back());
    it->second.pop_back();
  }
  return out;
}

// Builds the direct engines and the leaders' view for a group whose rank r is root rank
// root_ranks[r] (root_ranks sorted by the group's rank order). `name` is unique per group.
Status BuildEngines(const Root& root, const std::string& name, const std::vector<int>& root_ranks,
                    int rank, int group_salt, Links& links) {
  const int n = static_cast<int>(root_ranks.size());
  std::vector<int> host_index;  // host of each group rank, renumbered from 0
  std::map<int, int> renumber;
  for (int rr : root_ranks) {
    auto [it, added] = renumber.emplace(root.hosts[rr], static_cast<int>(renumber.size()));
    host_index.push_back(it->second);
  }
  links.hosts = host_index;
  links.num_hosts = static_cast<int>(renumber.size());
  const bool shm_allowed = root.options.transport != TransportKind::kTcp;
  const CommunicatorOptions& o = root.options;
  // Every rank of the whole job on this host shares its cores, whatever group it is in.
  const int host_ranks = static_cast<int>(
      std::count(root.hosts.begin(), root.hosts.end(), root.hosts[root_ranks[rank]]));
  auto make_direct = [&](const std::string& group, int r,
                         int size) -> Result<std::unique_ptr<ShmDirectGroup>> {
    return ShmDirectGroup::Create({.store = o.store,
                                   .group = group,
                                   .rank = r,
                                   .size = size,
                                   .clock = o.clock,
                                   .connect_timeout = o.connect_timeout,
                                   .staging_bytes = o.staging_bytes,
                                   .host_ranks = host_ranks});
  };
  if (n == 1) return OkStatus();
  if (links.num_hosts == 1) {
    if (shm_allowed) {
      KC_ASSIGN_OR_RETURN(links.direct, make_direct(name + "/direct", rank, n));
    }
    return OkStatus();
  }
  // Several hosts: this host's ranks, and the leaders (lowest rank of each host).
  std::vector<int> local;
  std::vector<int> leaders;
  std::vector<bool> seen(links.num_hosts, false);
  for (int r = 0; r < n; ++r) {
    if (host_index[r] == host_index[rank]) local.push_back(r);
    if (!seen[host_index[r]]) {
      seen[host_index[r]] = true;
      leaders.push_back(r);
    }
  }
  links.some_host_shared = static_cast<int>(leaders.size()) < n;
  if (local.size() > 1) {
    if (shm_allowed) {
      const int local_rank =
          static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
      KC_ASSIGN_OR_RETURN(links.local,
                          make_direct(name + "/direct/h" + std::to_string(host_index[rank]),
                                      local_rank, static_cast<int>(local.size())));
    } else {
      std::vector<int> local_root_ranks;
      for (int r : local) local_root_ranks.push_back(root_ranks[r]);
      KC_ASSIGN_OR_RETURN(links.local_view,
                          CreateSubgroupTransport(root.transport, local_root_ranks,
                                                  static_cast<uint16_t>(group_salt + 2)));
    }
  }
  if (local.front() == rank) {
    std::vector<int> leader_root_ranks;
    for (int r : leaders) leader_root_ranks.push_back(root_ranks[r]);
    KC_ASSIGN_OR_RETURN(links.leaders,
                        CreateSubgroupTransport(root.transport, leader_root_ranks,
                                                static_cast<uint16_t>(group_salt + 1)));
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------

class CommunicatorImpl;

// Lets a point-to-point Work outlive its communicator: a failure it reports after the
// communicator is gone is dropped. Safe for concurrent use.
class FailHook {
 public:
  explicit FailHook(CommunicatorImpl* comm) : comm_(comm) {}
  void Fail(const Status& s);  // after CommunicatorImpl
  void Detach() {
    MutexLock lock(&mu_);
    comm_ = nullptr;
  }

 private:
  Mutex mu_;
  CommunicatorImpl* comm_ KC_GUARDED_BY(mu_);
};

class CommunicatorImpl final : public Communicator {
 public:
  CommunicatorImpl(std::shared_ptr<Root> root, std::string name, std::vector<int> root_ranks,
                   int rank, Links links)
      : root_(std::move(root)),
        name_(std::move(name)),
        root_ranks_(std::move(root_ranks)),
        rank_(rank),
        links_(std::move(links)),
        clock_(root_->options.clock),
        progress_(std::make_shared<ProgressSlot>(name_)),
        queue_(std::make_shared<OpQueue>(clock_)) {
    if (const CommunicatorOptions& o = root_->options; o.topology != nullptr) {
      std::vector<bool> seen(links_.num_hosts, false);
      for (size_t r = 0; r < root_ranks_.size(); ++r) {
        const int device = o.devices[root_ranks_[r]];
        devices_.push_back(device);
        if (!seen[links_.hosts[r]]) {
          seen[links_.hosts[r]] = true;
          leader_devices_.push_back(device);
        }
      }
    }
    MutexLock lock(&root_->mu);
    std::erase_if(root_->slots, [](const std::weak_ptr<ProgressSlot>& s) { return s.expired(); });
    root_->slots.push_back(progress_);
  }

  // Works handed out keep the queue alive, so it is shut down here: nothing runs on links_
  // afterwards.
  ~CommunicatorImpl() override {
    fail_hook_->Detach();
    queue_->Shutdown();
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(root_ranks_.size()); }
  const std::string& group() const override { return name_; }
  const std::vector<int>& hosts() const override { return links_.hosts; }

  Result<std::shared_ptr<Work>> Allreduce(std::span<std::byte> data, size_t count,
                                          hal::DataType type, ReduceOp op,
                                          const OpOptions& o) override {
    KC_RETURN_IF_ERROR(CheckReduceArgs("allreduce", data, count, type, op));
    const int64_t bytes = static_cast<int64_t>(count * hal::DataTypeSize(type));
    Algorithm algo = o.algorithm != Algorithm::kAuto ? o.algorithm : ChooseAllreduce(bytes);
    KC_RETURN_IF_ERROR(CheckAlgorithm("allreduce", algo,
                                      {Algorithm::kRing, Algorithm::kRecursiveDoubling,
                                       Algorithm::kHierarchical, Algorithm::kDirect}));
    KC_RETURN_IF_ERROR(CheckWire("allreduce", type, op, o.wire));
    data = data.first(static_cast<size_t>(bytes));
    return Submit("allreduce", bytes, o,
                  [this, data, count, type, op, algo, lane = o.lane, wire = o.wire](
                      TimePoint deadline, uint64_t tag) -> Status {
                    if (size() == 1 || count == 0) return OkStatus();
                    AllreduceOptions a{.data = data,
                                       .count = count,
                                       .dtype = type,
                                       .op = op,
                                       .deadline = deadline,
                                       .tag = tag,
                                       .lane = lane,
                                       .wire = wire};
                    switch (algo) {
                      case Algorithm::kDirect:
                        return links_.direct->Allreduce(data, count, type, op, deadline);
                      case Algorithm::kRecursiveDoubling:
                        return AllreduceRecursiveDoubling(*links_.transport, a);
                      case Algorithm::kHierarchical:
                        return RunHierarchical(a, bytes_of(count, type));
                      default:
                        return comm::Allreduce(*links_.transport, a);
                    }
                  });
  }

  Result<std::shared_ptr<Work>> ReduceScatter(std::span<std::byte> data, size_t count,
                                              hal::DataType type, ReduceOp op,
                                              const OpOptions& o) override {
    KC_RETURN_IF_ERROR(CheckReduceArgs("reduce_scatter", data, count, type, op));
    KC_ASSIGN_OR_RETURN(const Algorithm algo, Pick("reduce_scatter", o, Algorithm::kRing));
    data = data.first(bytes_of(count, type));
    return Submit("reduce_scatter", static_cast<int64_t>(data.size()), o,
                  [this, data, count, type, op, algo, lane = o.lane](TimePoint deadline,
                                                                     uint64_t tag) -> Status {
                    if (size() == 1 || count == 0) return OkStatus();
                    if (algo == Algorithm::kDirect) {
                      return links_.direct->ReduceScatter(data, count, type, op, deadline);
                    }
                    return comm::ReduceScatter(*links_.transport, {.data = data,
                                                                   .count = count,
                                                                   .dtype = type,
                                                                   .op = op,
                                                                   .deadline = deadline,
                                                                   .tag = tag,
                                                                   .lane = lane});
                  });
  }

  Result<std::shared_ptr<Work>> Allgather(std::span<std::byte> data, size_t count,
                                          hal::DataType type, const OpOptions& o) override {
    KC_RETURN_IF_ERROR(CheckBuffer("allgather", data, count, type));
    KC_ASSIGN_OR_RETURN(const Algorithm algo, Pick("allgather", o, Algorithm::kRing));
    data = data.first(bytes_of(count, type));
    return Submit(
        "allgather", static_cast<int64_t>(data.size()), o,
        [this, data, count, type, algo, lane = o.lane](TimePoint deadline, uint64_t tag) -> Status {
          if (size() == 1 || count == 0) return OkStatus();
          if (algo == Algorithm::kDirect) {
            return links_.direct->Allgather(data, count, type, deadline);
          }
          return comm::Allgather(*links_.transport, {.data = data,
                                                     .count = count,
                                                     .dtype = type,
                                                     .deadline = deadline,
                                                     .tag = tag,
                                                     .lane = lane});
        });
  }

  Result<std::shared_ptr<Work>> Broadcast(std::span<std::byte> data, int root,
                                          const OpOptions& o) override {
    KC_RETURN_IF_ERROR(CheckRoot("broadcast", root));
    KC_ASSIGN_OR_RETURN(const Algorithm algo, Pick("broadcast", o, Algorithm::kRecursiveDoubling));
    return Submit(
        "broadcast", static_cast<int64_t>(data.size()), o,
        [this, data, root, algo, lane = o.lane](TimePoint deadline, uint64_t tag) -> Status {
          if (size() == 1 || data.empty()) return OkStatus();
          if (algo == Algorithm::kDirect) {
            return links_.direct->Broadcast(data, root, deadline);
          }
          return comm::Broadcast(
              *links_.transport,
              {.data = data, .root = root, .deadline = deadline, .tag = tag, .lane = lane});
        });
  }

  Result<std::shared_ptr<Work>> Reduce(std::span<std::byte> data, size_t count, hal::DataType type,
                                       ReduceOp op, int root, const OpOptions& o) override {
    KC_RETURN_IF_ERROR(CheckReduceArgs("reduce", data, count, type, op));
    KC_RETURN_IF_ERROR(CheckRoot("reduce", root));
    KC_ASSIGN_OR_RETURN(const Algorithm algo, Pick("reduce", o, Algorithm::kRecursiveDoubling));
    data = data.first(bytes_of(count, type));
    return Submit("reduce", static_cast<int64_t>(data.size()), o,
                  [this, data, count, type, op, root, algo, lane = o.lane](TimePoint deadline,
                                                                           uint64_t tag) -> Status {
                    if (size() == 1 || count == 0) return OkStatus();
                    if (algo == Algorithm::kDirect) {
                      return links_.direct->Reduce(data, count, type, op, root, deadline);
                    }
                    return comm::Reduce(*links_.transport, {.data = data,
                                                            .count = count,
                                                            .dtype = type,
                                                            .op = op,
                                                            .root = root,
                                                            .deadline = deadline,
                                                            .tag = tag,
                                                            .lane = lane});
                  });
  }

  Result<std::shared_ptr<Work>> Barrier(const OpOptions& o) override {
    KC_ASSIGN_OR_RETURN(const Algorithm algo, Pick("barrier", o, Algorithm::kRecursiveDoubling));
    return Submit(
        "barrier", 0, o, [this, algo, lane = o.lane](TimePoint deadline, uint64_t tag) -> Status {
          if (size() == 1) return OkStatus();
          if (algo == Algorithm::kDirect) return links_.direct->Barrier(deadline);
          return comm::Barrier(*links_.transport, {.deadline = deadline, .tag = tag, .lane = lane});
        });
  }

  Result<std::shared_ptr<Work>> Send(int peer, std::span<const std::byte> data, uint64_t tag,
                                     const OpOptions& o) override {
    KC_RETURN_IF_ERROR(CheckPeer("send", peer, tag));
    if (Status s = status(); !s.ok()) return std::shared_ptr<Work>(new DoneWork(s));
    Result<std::shared_ptr<Request>> r = links_.transport->Send(peer, tag, data, o.lane);
    return PointToPoint(std::move(r), o);
  }

  Result<std::shared_ptr<Work>> Recv(int peer, std::span<std::byte> data, uint64_t tag,
                                     const OpOptions& o) override {
    KC_RETURN_IF_ERROR(CheckPeer("recv", peer, tag));
    if (Status s = status(); !s.ok()) return std::shared_ptr<Work>(new DoneWork(s));
    Result<std::shared_ptr<Request>> r = links_.transport->Recv(peer, tag, data);
    return PointToPoint(std::move(r), o);
  }

  Result<std::unique_ptr<Communicator>> Split(int color, int key) override;
  Result<std::unique_ptr<Communicator>> SubGroup(std::span<const int> ranks) override;

  Result<std::shared_ptr<Buffer>> Allocate(size_t bytes) override {
    ShmDirectGroup* engine = links_.direct != nullptr ? links_.direct.get() : links_.local.get();
    if (engine == nullptr) return std::shared_ptr<Buffer>(new HeapBuffer(bytes));
    // Shared with the operation, which may outlive this call if Wait gives up.
    auto region = std::make_shared<std::shared_ptr<ShmRegion>>();
    KC_ASSIGN_OR_RETURN(std::shared_ptr<Work> work,
                        Submit("allocate", 0, {.timeout = root_->options.connect_timeout},
                               [engine, bytes, region](TimePoint deadline, uint64_t) -> Status {
                                 KC_ASSIGN_OR_RETURN(*region, engine->Allocate(bytes, deadline));
                                 return OkStatus();
                               }));
    KC_RETURN_IF_ERROR(work->Wait().WithContext("allocate " + std::to_string(bytes) + " bytes"));
    return std::shared_ptr<Buffer>(new RegionBuffer(*std::move(region)));
  }

  Algorithm ChooseAllreduce(int64_t bytes) const override {
    const Algorithm forced = root_->options.algorithm;
    if (forced != Algorithm::kAuto) return forced;
    if (links_.direct != nullptr) return Algorithm::kDirect;
    const bool hierarchical = links_.num_hosts > 1 && links_.some_host_shared;
    if (root_->options.topology != nullptr) {
      // The L1 cost model over this group's devices, as `kc topo report` estimates.
      switch (CostModelChoice(devices_, bytes)) {
        case hal::CollectiveAlgo::kTree:
          return Algorithm::kRecursiveDoubling;
        case hal::CollectiveAlgo::kHierarchical:
          return hierarchical ? Algorithm::kHierarchical : Algorithm::kRing;
        default:
          return Algorithm::kRing;
      }
    }
    if (hierarchical) return Algorithm::kHierarchical;
    return bytes <= root_->options.small_message_bytes ? Algorithm::kRecursiveDoubling
                                                       : Algorithm::kRing;
  }

  // The cheapest all-reduce over `devices` by the topology's cost model.
  // REQUIRES: root_->options.topology.
  hal::CollectiveAlgo CostModelChoice(const std::vector<int>& devices, int64_t bytes) const {
    return root_->options.topology->Collective(hal::CollectiveOp::kAllreduce, devices, bytes).algo;
  }

  Status status() const override {
    MutexLock lock(&mu_);
    return failure_;
  }

  void Abort(Status reason) override {
    if (reason.ok()) reason = AbortedError("communicator " + name_ + " aborted");
    Fail(reason);
  }

  CommunicatorMetrics metrics() const override {
    CommunicatorMetrics m;
    {
      MutexLock lock(&mu_);
      m = metrics_;
    }
    if (root_->transport != nullptr) m.links = root_->transport->link_stats();
    return m;
  }

  std::vector<OpProgress> progress() const override {
    std::vector<std::shared_ptr<ProgressSlot>> slots;
    {
      MutexLock lock(&root_->mu);
      for (const std::weak_ptr<ProgressSlot>& w : root_->slots) {
        if (std::shared_ptr<ProgressSlot> s = w.lock()) slots.push_back(std::move(s));
      }
    }
    std::vector<OpProgress> out;
    for (const auto& s : slots) out.push_back(s->Get());
    return out;
  }

 private:
  static size_t bytes_of(size_t count, hal::DataType type) {
    return count * hal::DataTypeSize(type);
  }

  Status CheckRoot(std::string_view what, int root) const {
    if (root < 0 || root >= size()) {
      return InvalidArgumentError(std::string(what) + ": root " + std::to_string(root) +
                                  " outside [0, " + std::to_string(size()) + ")");
    }
    return OkStatus();
  }

  Status CheckPeer(std::string_view what, int peer, uint64_t tag) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      return InvalidArgumentError(std::string(what) + ": peer " + std::to_string(peer) +
                                  " is not another rank of [0, " + std::to_string(size()) + ")");
    }
    if (tag >= kUserTagLimit) {
      return InvalidArgumentError(std::string(what) + ": tag " + std::to_string(tag) +
                                  " is not below 2^40");
    }
    return OkStatus();
  }

  Status CheckAlgorithm(std::string_view what, Algorithm algo,
                        std::initializer_list<Algorithm> allowed) const {
    if (std::find(allowed.begin(), allowed.end(), algo) == allowed.end()) {
      return InvalidArgumentError(std::string(what) + ": algorithm " +
                                  std::string(AlgorithmName(algo)) + " does not apply");
    }
    if (algo == Algorithm::kDirect && links_.direct == nullptr && size() > 1) {
      return InvalidArgumentError(
          std::string(what) +
          ": algorithm direct needs every rank on one host over shared memory (transport "
          "auto or shm)");
    }
    return OkStatus();
  }

  // The algorithm of a collective other than all-reduce: an explicit OpOptions choice must
  // apply; the communicator-wide choice applies when it can, else the default.
  Result<Algorithm> Pick(std::string_view what, const OpOptions& o, Algorithm transport_algo) {
    if (o.algorithm != Algorithm::kAuto) {
      KC_RETURN_IF_ERROR(CheckAlgorithm(what, o.algorithm, {transport_algo, Algorithm::kDirect}));
      return o.algorithm;
    }
    const Algorithm forced = root_->options.algorithm;
    if (forced == transport_algo) return forced;
    if (links_.direct != nullptr && (forced == Algorithm::kAuto || forced == Algorithm::kDirect)) {
      return Algorithm::kDirect;
    }
    return transport_algo;
  }

  // Hierarchical all-reduce: reduce to the leader inside each host, all-reduce among the
  // host leaders, broadcast back inside each host. Inside a host: the direct engine, or a
  // tree over the host's view of the transport (TCP only).
  Status RunHierarchical(const AllreduceOptions& a, size_t bytes) {
    if (links_.num_hosts == 1) return comm::Allreduce(*links_.transport, a);
    const ReduceOp sum_op = a.op == ReduceOp::kAvg ? ReduceOp::kSum : a.op;
    if (links_.local != nullptr) {
      KC_RETURN_IF_ERROR(links_.local->Reduce(a.data, a.count, a.dtype, sum_op, 0, a.deadline)
                             .WithContext("hierarchical allreduce: host reduce"));
    } else if (links_.local_view != nullptr) {
      KC_RETURN_IF_ERROR(comm::Reduce(*links_.local_view, {.data = a.data,
                                                           .count = a.count,
                                                           .dtype = a.dtype,
                                                           .op = sum_op,
                                                           .root = 0,
                                                           .deadline = a.deadline,
                                                           .tag = a.tag,
                                                           .lane = a.lane})
                             .WithContext("hierarchical allreduce: host reduce"));
    }
    if (links_.leaders != nullptr) {
      AllreduceOptions l = a;
      l.op = sum_op;
      const Algorithm algo = LeadersAlgorithm(static_cast<int64_t>(bytes));
      Status s = algo == Algorithm::kRecursiveDoubling
                     ? AllreduceRecursiveDoubling(*links_.leaders, l)
                     : comm::Allreduce(*links_.leaders, l);
      KC_RETURN_IF_ERROR(s.WithContext("hierarchical allreduce: leaders"));
      if (a.op == ReduceOp::kAvg) ScaleByInverse(a.dtype, a.data.data(), a.count, size());
    }
    if (links_.local != nullptr) {
      KC_RETURN_IF_ERROR(links_.local->Broadcast(a.data, 0, a.deadline)
                             .WithContext("hierarchical allreduce: host broadcast"));
    } else if (links_.local_view != nullptr) {
      KC_RETURN_IF_ERROR(
          comm::Broadcast(
              *links_.local_view,
              {.data = a.data, .root = 0, .deadline = a.deadline, .tag = a.tag, .lane = a.lane})
              .WithContext("hierarchical allreduce: host broadcast"));
    }
    return OkStatus();
  }

  // Among the host leaders: by the cost model over the leaders' devices when there is a
  // topology (ring or tree; they are one per host), else by size.
  Algorithm LeadersAlgorithm(int64_t bytes) const {
    if (root_->options.topology != nullptr) {
      return CostModelChoice(leader_devices_, bytes) == hal::CollectiveAlgo::kTree
                 ? Algorithm::kRecursiveDoubling
                 : Algorithm::kRing;
    }
    return bytes <= root_->options.small_message_bytes ? Algorithm::kRecursiveDoubling
                                                       : Algorithm::kRing;
  }

  using RunFn = std::function<Status(TimePoint deadline, uint64_t tag)>;

  // Queues one collective. The tag comes from the submission order, which every rank
  // shares.
  Result<std::shared_ptr<Work>> Submit(const char* what, int64_t bytes, const OpOptions& o,
                                       RunFn fn) {
    const Duration timeout = o.timeout > Duration::zero() ? o.timeout : root_->options.timeout;
    auto op = std::make_shared<Op>();
    op->deadline = clock_->Now() + timeout;
    uint64_t tag, seq;
    {
      MutexLock lock(&mu_);
      if (!failure_.ok()) return std::shared_ptr<Work>(new DoneWork(failure_));
      seq = next_seq_++;
      tag = kCollectiveTag | (seq % kUserTagLimit);
    }
    op->run = [this, what, fn = std::move(fn), deadline = op->deadline, tag, seq,
               bytes]() -> Status {
      KC_LAYER_ENTRY(Layer::kComm, "communicator");
      if (Status s = status(); !s.ok()) return s;
      progress_->Enter(what, seq, bytes);
      Status s = Admit(bytes, deadline);
      if (s.ok()) s = fn(deadline, tag);
      progress_->Leave();
      Count(bytes, s);
      if (!s.ok()) Fail(s);
      return s;
    };
    std::shared_ptr<Work> work(new QueuedWork(queue_, op));
    queue_->Push(std::move(op));
    return work;
  }

  Status Admit(int64_t bytes, TimePoint deadline) {
    RateLimiter* limiter = root_->options.rate_limiter;
    if (limiter == nullptr) return OkStatus();
    const TimePoint t0 = clock_->Now();
    KC_RETURN_IF_ERROR(limiter->Acquire(bytes, deadline).WithContext("rate limit"));
    const Duration waited = clock_->Now() - t0;
    if (waited > Duration::zero()) {
      MutexLock lock(&mu_);
      ++metrics_.rate_limited;
      metrics_.rate_limit_wait += waited;
    }
    return OkStatus();
  }

  void Count(int64_t bytes, const Status& s) {
    MutexLock lock(&mu_);
    ++metrics_.ops;
    metrics_.bytes += bytes;
    if (!s.ok()) ++metrics_.failed;
  }

  // Makes the failure sticky and breaks the links so that peers fail now.
  void Fail(const Status& s) {
    {
      MutexLock lock(&mu_);
      if (!failure_.ok()) return;
      failure_ = s.WithContext("communicator " + name_ + " rank " + std::to_string(rank_));
    }
    if (links_.direct != nullptr) links_.direct->Abort(s);
    if (links_.local != nullptr) links_.local->Abort(s);
    // Views (sub-group transport, local and leaders views) abort the root's transport.
    links_.transport->Abort(s);
  }

  Result<std::shared_ptr<Work>> PointToPoint(Result<std::shared_ptr<Request>> r,
                                             const OpOptions& o);

  friend class FailHook;
  friend Result<std::unique_ptr<Communicator>> MakeChild(CommunicatorImpl& parent,
                                                         std::vector<int> members, int salt);

  const std::shared_ptr<Root> root_;
  const std::string name_;
  const std::vector<int> root_ranks_;  // root rank of each rank of this group
  const int rank_;
  Links links_;
  // With a topology (CommunicatorOptions::topology): each rank's device, and each host
  // leader's, for the cost model; set in the constructor.
  std::vector<int> devices_;
  std::vector<int> leader_devices_;
  Clock* const clock_;
  mutable Mutex mu_;
  Status failure_ KC_GUARDED_BY(mu_);
  uint64_t next_seq_ KC_GUARDED_BY(mu_) = 0;
  CommunicatorMetrics metrics_ KC_GUARDED_BY(mu_);
  const std::shared_ptr<ProgressSlot> progress_;  // its newest operation
  const std::shared_ptr<FailHook> fail_hook_ = std::make_shared<FailHook>(this);
  std::shared_ptr<OpQueue> queue_;  // last: its worker runs ops that use the fields above
};

void FailHook::Fail(const Status& s) {
  MutexLock lock(&mu_);
  if (comm_ != nullptr) comm_->Fail(s);
}

// A point-to-point request seen as a Work: waits on the request, bounded by the op's
// deadline, and fails the communicator if the link failed.
class RequestWork final : public Work {
 public:
  RequestWork(std::shared_ptr<Request> request, TimePoint deadline,
              std::shared_ptr<FailHook> on_failure)
      : request_(std::move(request)), deadline_(deadline), on_failure_(std::move(on_failure)) {}
  Status Wait() override { return Wait(deadline_); }
  Status Wait(TimePoint deadline) override {
    Status s = request_->Wait(std::min(deadline, deadline_));
    if (!s.ok() && !(s.code() == ErrorCode::kDeadlineExceeded && deadline < deadline_)) {
      on_failure_->Fail(s);
    }
    return s;
  }
  std::optional<Status> Test() override { return request_->Test(); }

 private:
  std::shared_ptr<Request> request_;
  TimePoint deadline_;
  std::shared_ptr<FailHook> on_failure_;
};

Result<std::shared_ptr<Work>> CommunicatorImpl::PointToPoint(Result<std::shared_ptr<Request>> r,
                                                             const OpOptions& o) {
  if (!r.ok()) {
    if (r.status().code() != ErrorCode::kInvalidArgument) Fail(r.status());
    return r.status();
  }
  const Duration timeout = o.timeout > Duration::zero() ? o.timeout : root_->options.timeout;
  return std::shared_ptr<Work>(new RequestWork(*std::move(r), clock_->Now() + timeout, fail_hook_));
}

Result<std::unique_ptr<Communicator>> MakeChild(CommunicatorImpl& parent, std::vector<int> members,
                                                int salt) {
  const Root& root = *parent.root_;
  std::vector<int> root_ranks;
  int rank = -1;
  for (int m : members) {
    if (m == parent.rank_) rank = static_cast<int>(root_ranks.size());
    root_ranks.push_back(parent.root_ranks_[m]);
  }
  // Groups made by one Split share the salt; their first root ranks tell them apart.
  const std::string name =
      root.options.group + "/sub" + std::to_string(salt) + "." + std::to_string(root_ranks[0]);
  Links links;
  KC_ASSIGN_OR_RETURN(links.transport, CreateSubgroupTransport(root.transport, root_ranks,
                                                               static_cast<uint16_t>(salt)));
  KC_RETURN_IF_ERROR(BuildEngines(root, name, root_ranks, rank, salt, links));
  return std::unique_ptr<Communicator>(
      new CommunicatorImpl(parent.root_, name, std::move(root_ranks), rank, std::move(links)));
}

Result<std::unique_ptr<Communicator>> CommunicatorImpl::Split(int color, int key) {
  // Every rank contributes (color, key, next free salt); the new groups take the largest
  // salt offered, so a salt is never reused by two groups that share a pair of ranks.
  const int n = size();
  // Shared with the operation, which may outlive this call if Wait gives up.
  auto shared_table = std::make_shared<std::vector<int64_t>>(3 * static_cast<size_t>(n));
  std::vector<int64_t>& table = *shared_table;
  {
    MutexLock lock(&root_->mu);
    table[3 * rank_] = color;
    table[3 * rank_ + 1] = key;
    table[3 * rank_ + 2] = root_->next_salt;
  }
  std::span<std::byte> bytes = std::as_writable_bytes(std::span(table));
  KC_ASSIGN_OR_RETURN(
      std::shared_ptr<Work> work,
      Submit("split", static_cast<int64_t>(bytes.size()),
             {.timeout = root_->options.connect_timeout},
             [this, bytes, n, shared_table](TimePoint deadline, uint64_t tag) -> Status {
               if (n == 1) return OkStatus();
               return comm::Allgather(*links_.transport, {.data = bytes,
                                                          .count = static_cast<size_t>(3 * n),
                                                          .dtype = hal::DataType::kI64,
                                                          .deadline = deadline,
                                                          .tag = tag,
                                                          .lane = Lane::kControl});
             }));
  KC_RETURN_IF_ERROR(work->Wait().WithContext("split"));
  int64_t salt = 0;
  for (int r = 0; r < n; ++r) salt = std::max(salt, table[3 * r + 2]);
  if (salt + kSaltsPerGroup > kSaltLimit) {
    return ResourceExhaustedError("split: out of sub-group salts (at most about " +
                                  std::to_string(kSaltLimit / kSaltsPerGroup) + " splits)");
  }
  {
    MutexLock lock(&root_->mu);
    root_->next_salt = std::max<int>(root_->next_salt, static_cast<int>(salt) + kSaltsPerGroup);
  }
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (table[3 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return table[3 * a + 1] < table[3 * b + 1]; });
  return MakeChild(*this, std::move(members), static_cast<int>(salt));
}

Result<std::unique_ptr<Communicator>> CommunicatorImpl::SubGroup(std::span<const int> ranks) {
  std::vector<bool> seen(size(), false);
  int position = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= size() || seen[r]) {
      return InvalidArgumentError(
          "sub_group: ranks [" + Join(std::vector<int>(ranks.begin(), ranks.end())) +
          "] must be distinct ranks of [0, " + std::to_string(size()) + ")");
    }
    seen[r] = true;
    if (r == rank_) position = static_cast<int>(i);
  }
  if (ranks.empty()) return InvalidArgumentError("sub_group: no ranks");
  // Split with one color; the key orders members as given.
  return Split(position >= 0 ? 0 : -1, position);
}

}  // namespace

std::string_view TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kAuto:
      return "auto";
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
  }
  return "unknown";
}

std::optional<TransportKind> TransportKindFromName(std::string_view name) {
  for (TransportKind k : {TransportKind::kAuto, TransportKind::kShm, TransportKind::kTcp}) {
    if (TransportKindName(k) == name) return k;
  }
  return std::nullopt;
}

Result<std::unique_ptr<Communicator>> Communicator::Create(const CommunicatorOptions& options) {
  KC_LAYER_ENTRY(Layer::kComm, "communicator");
  const CommunicatorOptions& o = options;
  if (o.store == nullptr) return InvalidArgumentError("communicator: options.store is null");
  if (o.group.empty()) return InvalidArgumentError("communicator: options.group is empty");
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return InvalidArgumentError("communicator: rank " + std::to_string(o.rank) +
                                " outside [0, size " + std::to_string(o.size) + ")");
  }
  if (o.clock == nullptr) return InvalidArgumentError("communicator: options.clock is null");
  if (o.timeout <= Duration::zero()) {
    return InvalidArgumentError("communicator: options.timeout must be positive");
  }
  if (o.topology != nullptr && !o.devices.empty()) {
    if (o.devices.size() != static_cast<size_t>(o.size)) {
      return InvalidArgumentError("communicator: options.devices has " +
                                  std::to_string(o.devices.size()) +
                                  " entries, want one per rank (" + std::to_string(o.size) + ")");
    }
    for (size_t r = 0; r < o.devices.size(); ++r) {
      if (o.devices[r] < 0 || o.devices[r] >= o.topology->num_devices()) {
        return InvalidArgumentError("communicator: options.devices[" + std::to_string(r) +
                                    "] = " + std::to_string(o.devices[r]) +
                                    " is not a device of topology " + o.topology->name() + " (" +
                                    std::to_string(o.topology->num_devices()) + " devices)");
      }
    }
  }
  auto root = std::make_shared<Root>();
  root->options = o;
  if (root->options.host.empty()) root->options.host = HostName();
  const TimePoint deadline = o.store->clock()->Now() + o.connect_timeout;

  // Hosts: everyone publishes its own and reads the others'.
  const std::string prefix = "kc/comm/" + o.group + "/host/";
  KC_RETURN_IF_ERROR(o.store->Set(prefix + std::to_string(o.rank), root->options.host));
  std::vector<std::string> host_names(o.size);
  std::map<std::string, int> index;
  for (int r = 0; r < o.size; ++r) {
    Result<std::string> h = o.store->Get(prefix + std::to_string(r), deadline);
    if (!h.ok()) {
      return h.status().WithContext("communicator " + o.group + ": rank " + std::to_string(r) +
                                    " did not publish its host");
    }
    host_names[r] = *h;
    auto [it, added] = index.emplace(*h, static_cast<int>(index.size()));
    root->hosts.push_back(it->second);
  }
  const int num_hosts = static_cast<int>(index.size());
  if (o.topology != nullptr && o.devices.empty()) {
    Result<std::vector<int>> devices = DevicesByHost(*o.topology, host_names);
    if (!devices.ok()) return devices.status().WithContext("communicator " + o.group);
    root->options.devices = *std::move(devices);
  }
  if (o.transport == TransportKind::kShm && num_hosts > 1) {
    return InvalidArgumentError("communicator " + o.group +
                                ": transport shm needs every rank on one host, ranks are on " +
                                std::to_string(num_hosts) + " hosts");
  }

  // Links.
  auto make_shm = [&](const std::string& group, int rank,
                      int size) -> Result<std::unique_ptr<Transport>> {
    ShmTransportOptions shm{.store = o.store,
                            .group = group,
                            .rank = rank,
                            .size = size,
                            .clock = o.clock,
                            .connect_timeout = o.connect_timeout};
    if (o.shm_ring_bytes > 0) shm.ring_bytes = o.shm_ring_bytes;
    return CreateShmTransport(shm);
  };
  auto make_tcp = [&]() -> Result<std::unique_ptr<Transport>> {
    return CreateTcpTransport({.store = o.store,
                               .group = o.group + "/tcp",
                               .rank = o.rank,
                               .size = o.size,
                               .bind_address = o.bind_address,
                               .clock = o.clock,
                               .connect_timeout = o.connect_timeout,
                               .connections_per_peer = o.tcp_connections_per_peer,
                               .lanes = o.lanes});
  };
  if (o.size == 1 || o.transport == TransportKind::kTcp) {
    KC_ASSIGN_OR_RETURN(root->transport, make_tcp());
  } else if (num_hosts == 1) {
    KC_ASSIGN_OR_RETURN(root->transport, make_shm(o.group + "/shm", o.rank, o.size));
  } else {
    std::vector<int> local;
    for (int r = 0; r < o.size; ++r) {
      if (root->hosts[r] == root->hosts[o.rank]) local.push_back(r);
    }
    std::shared_ptr<Transport> shm;
    if (local.size() > 1) {
      const int local_rank =
          static_cast<int>(std::find(local.begin(), local.end(), o.rank) - local.begin());
      KC_ASSIGN_OR_RETURN(shm, make_shm(o.group + "/shm/h" + std::to_string(root->hosts[o.rank]),
                                        local_rank, static_cast<int>(local.size())));
    }
    KC_ASSIGN_OR_RETURN(std::shared_ptr<Transport> tcp, make_tcp());
    std::vector<internal::Route> routes(o.size);
    for (int r = 0; r < o.size; ++r) {
      if (r == o.rank) continue;
      const auto it = std::find(local.begin(), local.end(), r);
      if (it != local.end()) {
        routes[r] = {.transport = shm, .peer = static_cast<int>(it - local.begin())};
      } else {
        routes[r] = {.transport = tcp, .peer = r};
      }
    }
    root->transport =
        std::make_shared<internal::RoutingTransport>(o.rank, std::move(routes), o.clock);
  }

  std::vector<int> root_ranks(o.size);
  for (int r = 0; r < o.size; ++r) root_ranks[r] = r;
  Links links;
  links.transport = root->transport;
  KC_RETURN_IF_ERROR(BuildEngines(*root, o.group, root_ranks, o.rank, /*group_salt=*/0, links)
                         .WithContext("communicator " + o.group));
  return std::unique_ptr<Communicator>(
      new CommunicatorImpl(root, o.group, std::move(root_ranks), o.rank, std::move(links)));
}

}  // namespace kc::comm
