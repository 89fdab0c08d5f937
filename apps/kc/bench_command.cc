// `kc bench comm`: the nccl-tests table for our collectives. The command starts one worker
// process per rank (this binary again, with --worker-rank), which build a communicator
// through a TCP store served by this process; worker 0 gathers the times and prints.
#include "apps/kc/bench_command.h"

#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/kc/bench_args.h"
#include "apps/kc/bench_wire.h"
#include "base/clock.h"
#include "base/subprocess.h"
#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "hal/topology.h"

namespace kc::app {
namespace {

using comm::Algorithm;
using comm::Communicator;
using comm::ReduceOp;
using comm::TransportKind;
using hal::DataType;

// After a rank fails, how much longer than the operations' timeout the launcher waits for the
// others before it kills them.
constexpr double kFailureGraceS = 5;

// ---------------------------------------------------------------------------------------
// Worker: one rank.

struct Sample {
  double seconds = 0;  // mean per iteration on this rank
  bool ok = true;      // results checked and right
};

template <typename T>
void FillTyped(std::span<std::byte> data, size_t count, double v) {
  T* p = reinterpret_cast<T*>(data.data());
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, hal::Bf16>) {
      p[i] = hal::FloatToBf16(static_cast<float>(v));
    } else {
      p[i] = static_cast<T>(v);
    }
  }
}

void Fill(DataType t, std::span<std::byte> data, size_t count, double v) {
  switch (t) {
    case DataType::kF32:
      return FillTyped<float>(data, count, v);
    case DataType::kF64:
      return FillTyped<double>(data, count, v);
    case DataType::kI32:
      return FillTyped<int32_t>(data, count, v);
    case DataType::kI64:
      return FillTyped<int64_t>(data, count, v);
    case DataType::kBf16:
      return FillTyped<hal::Bf16>(data, count, v);
  }
}

double ValueAt(DataType t, std::span<const std::byte> data, size_t i) {
  switch (t) {
    case DataType::kF32:
      return reinterpret_cast<const float*>(data.data())[i];
    case DataType::kF64:
      return reinterpret_cast<const double*>(data.data())[i];
    case DataType::kI32:
      return reinterpret_cast<const int32_t*>(data.data())[i];
    case DataType::kI64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(data.data())[i]);
    case DataType::kBf16:
      return hal::Bf16ToFloat(reinterpret_cast<const hal::Bf16*>(data.data())[i]);
  }
  return 0;
}

// Rank r contributes r + 1 everywhere; the expected reduction of n ranks.
double Expected(ReduceOp op, int n) {
  switch (op) {
    case ReduceOp::kSum:
      return n * (n + 1) / 2.0;
    case ReduceOp::kAvg:
      return (n + 1) / 2.0;
    case ReduceOp::kMin:
      return 1;
    case ReduceOp::kMax:
      return n;
    case ReduceOp::kProd: {
      double p = 1;
      for (int i = 1; i <= n; ++i) p *= i;
      return p;
    }
  }
  return 0;
}

class Worker {
 public:
  Worker(const BenchArgs& a, const Plan& p, std::unique_ptr<comm::Store> store, int rank)
      : a_(a), p_(p), store_(std::move(store)), rank_(rank) {}

  Status Run() {
    const Duration timeout = SecondsToDuration(a_.timeout_s);
    KC_ASSIGN_OR_RETURN(comm_,
                        Communicator::Create({.store = store_.get(),
                                              .group = a_.group,
                                              .rank = rank_,
                                              .size = p_.world,
                                              .host = p_.hosts.empty() ? "" : p_.hosts[rank_],
                                              .transport = p_.transport,
                                              .bind_address = a_.bind,
                                              .connect_timeout = timeout,
                                              .timeout = timeout,
                                              .algorithm = p_.algo,
                                              .topology = p_.topology,
                                              .devices = Devices()}));
    const int64_t max_size = *std::max_element(p_.sizes.begin(), p_.sizes.end());
    // sendrecv needs a second buffer for what arrives.
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(max_size, 64));
    if (p_.registered) {
      KC_ASSIGN_OR_RETURN(registered_, comm_->Allocate(2 * bytes));
      buffer_ = registered_->bytes();
    } else {
      user_.reset(new (std::align_val_t{64}) std::byte[2 * bytes]);
      std::memset(user_.get(), 0, 2 * bytes);
      buffer_ = {user_.get(), 2 * bytes};
    }
    if (rank_ == 0) PrintHeader();
    if (rank_ == p_.fault_rank) raise(p_.fault_signal);  // --inject-fault
    if (p_.flood_bytes > 0) KC_RETURN_IF_ERROR(StartFlood());
    if (std::find(p_.ops.begin(), p_.ops.end(), "wire") != p_.ops.end()) {
      KC_ASSIGN_OR_RETURN(wire_, WireRing::Connect(*store_, a_.group, rank_, p_.world, a_.bind,
                                                   Clock::Real()->Now() + timeout));
    }
    Status s;
    for (const std::string& op : p_.ops) {
      for (int64_t size : p_.sizes) {
        s = Measure(op, size);
        if (!s.ok()) break;
      }
      if (!s.ok()) break;
    }
    Status flood = StopFlood();
    KC_RETURN_IF_ERROR(s);
    return flood;
  }

 private:
  // --inventory: rank r is its device r.
  std::vector<int> Devices() const {
    std::vector<int> d;
    if (p_.topology != nullptr) {
      for (int r = 0; r < p_.world; ++r) d.push_back(r);
    }
    return d;
  }

  // One call of `op` on `size` bytes, waited for.
  Status Once(const std::string& op, size_t count, size_t size) {
    std::span<std::byte> data = buffer_.first(size);
    if (op == "wire") {
      return wire_->Stream(data, buffer_.subspan(size, size),
                           Clock::Real()->Now() + SecondsToDuration(a_.timeout_s));
    }
    const int n = p_.world;
    Result<std::shared_ptr<comm::Work>> w = [&]() -> Result<std::shared_ptr<comm::Work>> {
      if (op == "allreduce") {
        return comm_->Allreduce(data, count, p_.dtype, p_.redop, {.wire = p_.wire});
      }
      if (op == "reduce_scatter") return comm_->ReduceScatter(data, count, p_.dtype, p_.redop);
      if (op == "allgather") return comm_->Allgather(data, count, p_.dtype);
      if (op == "broadcast") return comm_->Broadcast(data, 0);
      if (op == "reduce") return comm_->Reduce(data, count, p_.dtype, p_.redop, 0);
      if (op == "barrier") return comm_->Barrier();
      // sendrecv: a ring, as nccl-tests' sendrecv.
      if (n == 1) return comm_->Barrier();
      KC_ASSIGN_OR_RETURN(auto recv, comm_->Recv((rank_ + n - 1) % n, buffer_.subspan(size, size)));
      KC_ASSIGN_OR_RETURN(auto send, comm_->Send((rank_ + 1) % n, data));
      KC_RETURN_IF_ERROR(send->Wait());
      return recv;
    }();
    KC_RETURN_IF_ERROR(w.status());
    return (*w)->Wait();
  }

  // Whether the buffer holds what one call on freshly filled inputs should give.
  bool Verify(const std::string& op, size_t count, size_t size) {
    const int n = p_.world;
    std::span<const std::byte> data = buffer_.first(size);
    auto all = [&](size_t from, size_t to, double want) {
      for (size_t i = from; i < to; ++i) {
        if (std::fabs(ValueAt(p_.dtype, data, i) - want) > 1e-6 * std::max(1.0, std::fabs(want))) {
          return false;
        }
      }
      return true;
    };
    if (op == "allreduce") return all(0, count, Expected(p_.redop, n));
    if (op == "reduce_scatter") {
      const comm::ChunkRange c = comm::ChunkOf(count, n, rank_);
      return all(c.offset, c.offset + c.count, Expected(p_.redop, n));
    }
    if (op == "reduce") return all(0, count, rank_ == 0 ? Expected(p_.redop, n) : rank_ + 1);
    if (op == "allgather") {
      for (int r = 0; r < n; ++r) {
        const comm::ChunkRange c = comm::ChunkOf(count, n, r);
        if (!all(c.offset, c.offset + c.count, r + 1)) return false;
      }
      return true;
    }
    if (op == "broadcast") return all(0, count, 1);
    if (op == "sendrecv" && n > 1) {
      std::span<const std::byte> in = buffer_.subspan(size, size);
      const double want = (rank_ + n - 1) % n + 1;
      for (size_t i = 0; i < count; ++i) {
        if (ValueAt(p_.dtype, in, i) != want) return false;
      }
    }
    return true;
  }

  Status Measure(const std::string& op, int64_t size_bytes) {
    const size_t esize = hal::DataTypeSize(p_.dtype);
    const size_t count = static_cast<size_t>(size_bytes) / esize;
    const size_t size = count * esize;
    Sample sample;
    if (a_.check && op != "barrier" && op != "wire") {
      Fill(p_.dtype, buffer_, count, rank_ + 1);
      KC_RETURN_IF_ERROR(Once(op, count, size).WithContext(op + " " + std::to_string(size)));
      sample.ok = Verify(op, count, size);
    }
    for (int i = 0; i < a_.warmup; ++i) KC_RETURN_IF_ERROR(Once(op, count, size));
    KC_RETURN_IF_ERROR(Barrier());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < a_.iters; ++i) KC_RETURN_IF_ERROR(Once(op, count, size));
    const auto t1 = std::chrono::steady_clock::now();
    sample.seconds = std::chrono::duration<double>(t1 - t0).count() / a_.iters;
    // Every rank publishes its mean; rank 0 takes the slowest, as nccl-tests does.
    const std::string key = fmt::format("kc/bench/{}/{}/{}/", a_.group, op, size_bytes);
    KC_RETURN_IF_ERROR(store_->Set(key + std::to_string(rank_),
                                   fmt::format("{} {}", sample.seconds, sample.ok ? 1 : 0)));
    if (rank_ != 0) return OkStatus();
    double worst = 0;
    bool ok = true;
    const TimePoint deadline = store_->clock()->Now() + std::chrono::seconds(60);
    for (int r = 0; r < p_.world; ++r) {
      KC_ASSIGN_OR_RETURN(std::string v, store_->Get(key + std::to_string(r), deadline));
      double s = 0;
      int good = 0;
      if (std::sscanf(v.c_str(), "%lf %d", &s, &good) != 2) {
        return InternalError("bench: bad sample \"" + v + "\" from rank " + std::to_string(r));
      }
      worst = std::max(worst, s);
      ok = ok && good == 1;
    }
    PrintRow(op, size, count, worst, ok);
    return OkStatus();
  }

  Status Barrier() {
    KC_ASSIGN_OR_RETURN(auto w, comm_->Barrier());
    return w->Wait();
  }

  // --flood: a second communicator over the same links keeps a telemetry-lane ring
  // all-reduce of flood_bytes running, to show that it does not delay the measured
  // (gradient-lane) operations. Ranks stop together: after each flood all-reduce they
  // all-reduce a stop flag.
  Status StartFlood() {
    KC_ASSIGN_OR_RETURN(flood_comm_, comm_->Split(0, rank_));
    flood_data_.assign(static_cast<size_t>(p_.flood_bytes) / sizeof(float), 1.0f);
    flood_thread_ = std::thread([this] {
      const comm::OpOptions o{.algorithm = Algorithm::kRing, .lane = comm::Lane::kTelemetry};
      while (true) {
        auto w = flood_comm_->Allreduce(std::span(flood_data_), ReduceOp::kMax, o);
        Status s = w.ok() ? (*w)->Wait() : w.status();
        std::vector<int32_t> stop = {stop_flood_.load() ? 1 : 0};
        if (s.ok()) {
          auto f = flood_comm_->Allreduce(std::span(stop), ReduceOp::kMax,
                                          {.lane = comm::Lane::kTelemetry});
          s = f.ok() ? (*f)->Wait() : f.status();
        }
        if (!s.ok()) {
          flood_status_ = s.WithContext("flood");
          return;
        }
        ++flood_ops_;
        if (stop[0] != 0) return;
      }
    });
    return OkStatus();
  }

  Status StopFlood() {
    if (!flood_thread_.joinable()) return OkStatus();
    stop_flood_ = true;
    flood_thread_.join();
    flood_comm_.reset();
    return flood_status_;
  }

  std::string AlgoName(const std::string& op, size_t size) const {
    if (op == "allreduce") return std::string(comm::AlgorithmName(comm_->ChooseAllreduce(size)));
    if (op == "wire") return "stream";
    return std::string(comm::AlgorithmName(p_.algo));
  }

  void PrintHeader() const {
    if (a_.format != "table") return;
    int hosts = 1;
    if (!p_.hosts.empty()) {
      std::vector<std::string> h = p_.hosts;
      std::sort(h.begin(), h.end());
      hosts = static_cast<int>(std::unique(h.begin(), h.end()) - h.begin());
    }
    std::cout << fmt::format(
        "# kc bench comm: {} ranks on {} host(s), transport {}, algorithm {}, wire {}, buffers "
        "{}, {} iterations after {} warm-up{}\n#\n",
        p_.world, hosts, a_.transport, a_.algo, a_.wire, a_.buffers, a_.iters, a_.warmup,
        p_.flood_bytes > 0 ? fmt::format(", under a {}-byte telemetry-lane flood", p_.flood_bytes)
                           : "");
    std::cout << fmt::format(
                     "# {:>14} {:>12} {:>12} {:>6} {:>6} {:>18} {:>11} {:>11} {:>11} {:>6}\n", "op",
                     "size", "count", "type", "redop", "algo", "time(us)", "algbw(GB/s)",
                     "busbw(GB/s)", "check")
              << std::flush;
  }

  void PrintRow(const std::string& op, size_t size, size_t count, double seconds, bool ok) const {
    const double algbw = seconds > 0 ? static_cast<double>(size) / seconds / 1e9 : 0;
    const double busbw = algbw * BusFactor(op, p_.world);
    const std::string algo = AlgoName(op, size);
    const std::string check = !a_.check || op == "barrier" || op == "wire" ? "-"
                              : ok                                         ? "ok"
                                                                           : "WRONG";
    if (a_.format == "json") {
      nlohmann::json j = {{"impl", "kc"},
                          {"op", op},
                          {"ranks", p_.world},
                          {"transport", a_.transport},
                          {"buffers", a_.buffers},
                          {"algo", algo},
                          {"wire", a_.wire},
                          {"dtype", a_.dtype},
                          {"redop", a_.redop},
                          {"size", size},
                          {"count", count},
                          {"time_us", seconds * 1e6},
                          {"algbw", algbw},
                          {"busbw", busbw},
                          {"flood", p_.flood_bytes},
                          {"check", check}};
      std::cout << j.dump() << "\n" << std::flush;
      return;
    }
    std::cout << fmt::format(
                     "{:>16} {:>12} {:>12} {:>6} {:>6} {:>18} {:>11.2f} {:>11.3f} "
                     "{:>11.3f} {:>6}\n",
                     op, size, count, a_.dtype, a_.redop, algo, seconds * 1e6, algbw, busbw, check)
              << std::flush;
  }

  const BenchArgs& a_;
  const Plan& p_;
  std::unique_ptr<comm::Store> store_;
  const int rank_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<WireRing> wire_;  // --op wire
  std::shared_ptr<comm::Buffer> registered_;
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte[], AlignedDelete> user_;
  std::span<std::byte> buffer_;
  std::unique_ptr<Communicator> flood_comm_;
  std::vector<float> flood_data_;
  std::thread flood_thread_;
  std::atomic<bool> stop_flood_{false};
  std::atomic<int64_t> flood_ops_{0};
  Status flood_status_;  // written by flood_thread_ before it ends
};

// --cpu-bind core: with no more local ranks than CPUs, pin each rank to its own CPU, as
// mpirun does by default; spinning ranks that share a CPU wait on each other's time slices.
// auto does so only where ranks work on the direct shared-memory path (one host, shared
// memory allowed, algorithm auto or direct): elsewhere each rank's transport progress thread
// needs a CPU besides the rank's own thread.
void BindToCpu(const BenchArgs& a, const Plan& p) {
  if (a.cpu_bind == "none") return;
  if (a.cpu_bind == "auto") {
    std::vector<std::string> hosts = p.hosts;
    std::sort(hosts.begin(), hosts.end());
    const bool one_host = std::unique(hosts.begin(), hosts.end()) - hosts.begin() <= 1;
    const bool direct = p.transport != TransportKind::kTcp && one_host &&
                        (p.algo == Algorithm::kAuto || p.algo == Algorithm::kDirect);
    if (!direct) return;
  }
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (a.ranks > static_cast<int>(cpus.size())) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[a.local_rank % cpus.size()], &one);
  sched_setaffinity(0, sizeof(one), &one);
}

int RunWorker(const BenchArgs& a, const Plan& p) {
  BindToCpu(a, p);
  std::string host;
  int port = 0;
  if (Status s = ParseHostPort(a.store, &host, &port); !s.ok()) {
    std::cerr << "kc bench comm: " << s.message() << "\n";
    return kExitBadInput;
  }
  Result<std::unique_ptr<comm::TcpStoreClient>> store =
      comm::TcpStoreClient::Connect(host, port, Clock::Real()->Now() + std::chrono::seconds(60));
  if (!store.ok()) {
    std::cerr << "kc bench comm: rank " << a.worker_rank << ": " << store.status() << "\n";
    return kExitFailure;
  }
  Worker w(a, p, *std::move(store), a.worker_rank);
  if (Status s = w.Run(); !s.ok()) {
    std::cerr << "kc bench comm: rank " << a.worker_rank << ": " << s << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------
// Launcher.

std::vector<std::string> WorkerArgv(const BenchArgs& a, int rank, const std::string& store,
                                    int world) {
  std::vector<std::string> v = {"kc",
                                "bench",
                                "comm",
                                "--sizes",
                                a.sizes,
                                "--op",
                                a.op,
                                "--dtype",
                                a.dtype,
                                "--redop",
                                a.redop,
                                "--algo",
                                a.algo,
                                "--wire",
                                a.wire,
                                "--transport",
                                a.transport,
                                "--buffers",
                                a.buffers,
                                "--iters",
                                std::to_string(a.iters),
                                "--warmup",
                                std::to_string(a.warmup),
                                "--format",
                                a.format,
                                "--timeout",
                                fmt::format("{}", a.timeout_s),
                                "--store",
                                store,
                                "--world",
                                std::to_string(world),
                                "--bind",
                                a.bind,
                                "--group",
                                a.group,
                                "--worker-rank",
                                std::to_string(rank),
                                "--ranks",
                                std::to_string(a.ranks),
                                "--local-rank",
                                std::to_string(rank - a.first_rank),
                                "--cpu-bind",
                                a.cpu_bind};
  if (!a.hosts.empty()) {
    v.push_back("--hosts");
    v.push_back(a.hosts);
  }
  if (!a.inventory.empty()) {
    v.push_back("--inventory");
    v.push_back(a.inventory);
  }
  if (!a.check) v.push_back("--no-check");
  if (!a.flood.empty()) {
    v.push_back("--flood");
    v.push_back(a.flood);
  }
  if (!a.inject_fault.empty()) {
    v.push_back("--inject-fault");
    v.push_back(a.inject_fault);
  }
  return v;
}

int RunBench(BenchArgs a) {
  Result<Plan> plan = Check(a);
  if (!plan.ok()) {
    std::cerr << "kc bench comm: " << plan.status().message() << "\n";
    return kExitBadInput;
  }
  if (a.worker_rank >= 0) return RunWorker(a, *plan);
  if (a.group.empty()) a.group = fmt::format("kc-bench-{}", getpid());

  // The store: served here by the invocation that runs rank 0, else the one named.
  std::unique_ptr<comm::TcpStoreServer> server;
  std::string store = a.store;
  if (a.first_rank == 0) {
    std::string host = "127.0.0.1";
    int port = 0;
    if (!a.store.empty()) {
      if (Status s = ParseHostPort(a.store, &host, &port); !s.ok()) {
        std::cerr << "kc bench comm: " << s.message() << "\n";
        return kExitBadInput;
      }
    }
    Result<std::unique_ptr<comm::TcpStoreServer>> s =
        comm::TcpStoreServer::Start({.bind_address = host, .port = port});
    if (!s.ok()) {
      std::cerr << "kc bench comm: store: " << s.status() << "\n";
      return kExitFailure;
    }
    server = *std::move(s);
    store = fmt::format("{}:{}", host, server->port());
  } else if (a.store.empty()) {
    std::cerr << "kc bench comm: --first-rank > 0 needs --store HOST:PORT of rank 0's run\n";
    return kExitBadInput;
  }

  // Every rank is killed if this function leaves before it ended (the handles' destructors).
  std::vector<Subprocess> ranks;
  for (int i = 0; i < a.ranks; ++i) {
    Result<Subprocess> child = Subprocess::Start(
        {.path = "/proc/self/exe", .argv = WorkerArgv(a, a.first_rank + i, store, plan->world)});
    if (!child.ok()) {
      std::cerr << "kc bench comm: cannot start rank " << a.first_rank + i << ": "
                << child.status().message() << "\n";
      return kExitFailure;
    }
    ranks.push_back(*std::move(child));
  }
  // Wait for every rank. Once one fails the others fail within their operations' timeout
  // (peers notice a dead or silent rank); one that has not ended by then (stopped, or hung)
  // is killed, so the launcher never waits for ever.
  int rc = kExitOk;
  const Duration grace = SecondsToDuration(a.timeout_s + kFailureGraceS);
  std::optional<TimePoint> deadline;  // set at the first failure
  int first_failed = -1;
  auto report = [&](size_t i, int status) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    const int rank = a.first_rank + static_cast<int>(i);
    if (WIFSIGNALED(status)) {
      // One write, so that the ranks' own lines on the same stderr cannot split it.
      std::cerr << fmt::format("kc bench comm: rank {} {}\n", rank, DescribeWaitStatus(status));
    }
    rc = WIFEXITED(status) && WEXITSTATUS(status) == kExitBadInput ? kExitBadInput : kExitFailure;
    if (!deadline) {
      deadline = Clock::Real()->Now() + grace;
      first_failed = rank;
    }
  };
  for (size_t left = ranks.size(); left > 0;) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i].reaped()) continue;
      fds.push_back({.fd = ranks[i].pidfd(), .events = POLLIN, .revents = 0});
      which.push_back(i);
    }
    int wait_ms = -1;
    if (deadline) {
      wait_ms = static_cast<int>(std::max<int64_t>(
          0,
          std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::Real()->Now()).count()));
    }
    const int n = poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || n < 0) {
      // The deadline passed: what is still running is stopped or hung.
      for (size_t i : which) {
        std::cerr << fmt::format(
            "kc bench comm: rank {} did not end within {:g} s of rank {}'s failure (stopped or "
            "hung): killed\n",
            a.first_rank + static_cast<int>(i), a.timeout_s + kFailureGraceS, first_failed);
        ranks[i].SignalGroup(SIGKILL);  // its group, or it alone when it leads none
        (void)ranks[i].Wait();
      }
      rc = kExitFailure;
      break;
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      std::optional<int> status = ranks[which[k]].TryWait();
      if (!status) continue;
      report(which[k], *status);
      --left;
    }
  }
  if (server != nullptr) server->Stop();
  return rc;
}

}  // namespace

void AddBenchCommand(CLI::App& app, Action* action) {
  CLI::App* bench = app.add_subcommand("bench", "Measure the system's building blocks");
  bench->require_subcommand(1);
  CLI::App* c = bench->add_subcommand(
      "comm",
      "Collective bandwidth and latency, as the nccl-tests table (size, count, type, "
      "time, algbw, busbw)");
  auto a = std::make_shared<BenchArgs>();
  c->add_option("--ranks", a->ranks, "Ranks (processes) this run starts on this machine")
      ->capture_default_str();
  c->add_option("--sizes", a->sizes, "Message sizes in bytes, comma-separated, K/M/G suffixes")
      ->capture_default_str();
  c->add_option("--op", a->op,
                "allreduce, reduce_scatter, allgather, broadcast, reduce, sendrecv, barrier, all, "
                "or wire (the TCP links' limit: each rank streams to its right neighbour over "
                "plain sockets; busbw is a ring all-reduce's ceiling)")
      ->capture_default_str();
  c->add_option("--dtype", a->dtype, "f32, f64, i32, i64 or bf16")->capture_default_str();
  c->add_option("--redop", a->redop, "sum, prod, min, max or avg")->capture_default_str();
  c->add_option("--algo", a->algo, "auto, ring, recursive_doubling, hierarchical or direct")
      ->capture_default_str();
  c->add_option("--wire", a->wire,
                "All-reduce: what travels between ranks, f32 or bf16 (f32 sums and averages sent "
                "as bf16, added in f32; ring and hierarchical)")
      ->capture_default_str();
  c->add_option("--transport", a->transport, "auto, shm or tcp")->capture_default_str();
  c->add_option("--buffers", a->buffers,
                "user (ordinary memory) or registered (allocated through the communicator)")
      ->capture_default_str();
  c->add_option("--iters", a->iters, "Timed iterations per size")->capture_default_str();
  c->add_option("--warmup", a->warmup, "Untimed iterations per size")->capture_default_str();
  c->add_option("--format", a->format, "table or json (JSON Lines)")->capture_default_str();
  c->add_option("--hosts", a->hosts,
                "Host name of every rank, comma-separated: ranks with different names talk "
                "TCP, as on separate machines (default: this machine for all)");
  c->add_option("--timeout", a->timeout_s, "Seconds each operation may take")
      ->capture_default_str();
  c->add_flag("!--no-check", a->check, "Skip checking each size's result once");
  c->add_option("--store", a->store,
                "HOST:PORT of the rendezvous store; the run with --first-rank 0 serves it");
  c->add_option("--world", a->world, "Ranks in the whole group, across runs (default --ranks)");
  c->add_option("--first-rank", a->first_rank, "The first rank this run starts");
  c->add_option("--bind", a->bind, "Address the TCP transport listens on")->capture_default_str();
  c->add_option("--group", a->group, "Group name (default from the process id)");
  c->add_option("--inventory", a->inventory,
                "Inventory file: rank r runs as its device r (on its host, simulated here unless "
                "--hosts), and --algo auto picks each all-reduce by its cost model, as kc topo "
                "report advises");
  c->add_option("--inject-fault", a->inject_fault,
                "RANK:stop or RANK:kill: that rank stops (SIGSTOP) or dies (SIGKILL) before its "
                "first measured operation (failure drills)");
  c->add_option("--flood", a->flood,
                "Keep a telemetry-lane ring all-reduce of this size running on the same links "
                "while measuring (the priority-lane check)");
  c->add_option("--cpu-bind", a->cpu_bind,
                "core: pin each rank to its own CPU when the ranks fit (as mpirun does); auto: "
                "only on the direct shared-memory path; none")
      ->capture_default_str();
  c->add_option("--local-rank", a->local_rank)->group("");    // internal
  c->add_option("--worker-rank", a->worker_rank)->group("");  // internal: run as this rank
  c->callback([action, a] { *action = [a] { return RunBench(*a); }; });
}

}  // namespace kc::app
