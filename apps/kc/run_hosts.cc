#include "apps/kc/run_hosts.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "apps/kc/command.h"
#include "apps/kc/train_hosts.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "base/subprocess.h"
#include "comm/store.h"
#include "comm/tcp_store.h"
#include "fault/heartbeat.h"
#include "fault/launch_env.h"
#include "fault/local_launcher.h"
#include "fault/remote_launcher.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;

// The store keys of a run across hosts: the remote launcher's (fault/remote_launcher.h) and
// address/HOST, where each host's share says where rank 0's TCPStore would listen on it.
constexpr char kRunPrefix[] = "kc-run/";
// A share beats ten times in this; the supervisor takes a share silent this long for lost, and
// a share cut off from the store this long kills its ranks (its fence).
constexpr Duration kHostTimeout = std::chrono::seconds(5);

std::string AddressKey(const std::string& host) { return "address/" + host; }
// Why a host's share killed rank `worker` (its heartbeats stopped), for the supervisor to say.
std::string SilentKey(int worker) { return "silent/" + std::to_string(worker); }

// What the supervisor asks of the shares' heartbeat watch, in each start's variables: taken
// out by the share (the program sees KC_HEARTBEAT_FILE and KC_HEARTBEAT_PERIOD only).
constexpr char kBeatTimeoutVariable[] = "KC_RUN_HEARTBEAT_TIMEOUT";
constexpr char kBeatFirstVariable[] = "KC_RUN_HEARTBEAT_FIRST";

// "ADDR:PORT", with brackets around an IPv6 address.
std::string JoinHostPort(const std::string& address, int port) {
  return address.find(':') != std::string::npos ? fmt::format("[{}]:{}", address, port)
                                                : fmt::format("{}:{}", address, port);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the ranks do, as the supervisor's loop reads it: pushed by the launcher's thread (or by
// a Signal that ends a rank at once), taken by the loop, which the descriptor wakes.
class RankQueue final : public fault::RankEvents {
 public:
  struct Event {
    int worker = 0;
    std::string line;                     // a line it wrote
    std::optional<fault::RankExit> exit;  // or how it ended
  };
  RankQueue() : wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~RankQueue() override {
    if (wake_ >= 0) close(wake_);
  }
  RankQueue(const RankQueue&) = delete;
  RankQueue& operator=(const RankQueue&) = delete;

  int fd() const { return wake_; }
  void OnOutput(int worker, std::string line) override {
    Push({.worker = worker, .line = std::move(line)});
  }
  void OnReport(int, fault::Report) override {}  // a command's ranks send none
  void OnExit(int worker, fault::RankExit exit) override {
    Push({.worker = worker, .exit = std::move(exit)});
  }
  std::deque<Event> Take() {
    uint64_t n;
    if (read(wake_, &n, sizeof n) < 0) {
      // Nothing was pushed since the last take: the queue is empty or about to be woken again.
    }
    MutexLock lock(&mu_);
    return std::exchange(events_, {});
  }

 private:
  void Push(Event e) {
    {
      MutexLock lock(&mu_);
      events_.push_back(std::move(e));
    }
    const uint64_t one = 1;
    if (write(wake_, &one, sizeof one) < 0) {
      // The counter is saturated: the loop is awake already.
    }
  }

  const int wake_;
  Mutex mu_;
  std::deque<Event> events_ KC_GUARDED_BY(mu_);
};

// A share's launcher with heartbeats: the ranks started with kBeatTimeoutVariable are watched
// (their files under `dir`), and one silent past the timeout is killed, why written to the
// store. Everything else goes to and from `inner` unchanged.
class BeatWatch final : public fault::ProcessLauncher, public fault::RankEvents {
 public:
  BeatWatch(fault::ProcessLauncher* inner, comm::Store* store, std::string dir)
      : inner_(inner), store_(store), dir_(std::move(dir)) {}
  ~BeatWatch() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
  }

  Status Start(const fault::RankLaunch& launch, fault::RankEvents* events) override {
    std::optional<fault::HeartbeatOptions> beats = BeatsOf(launch);
    if (!beats) return inner_->Start(launch, events);
    {
      MutexLock lock(&mu_);
      if (!monitor_) {
        monitor_.emplace(
            [dir = dir_](int w) { return fault::FileBeat(fault::HeartbeatFile(dir, w)); }, 0,
            *beats, fault::HeartbeatMonitor::Clock::now());
        options_ = *beats;
        thread_ = std::thread([this] { Loop(); });
      }
      monitor_->Watch(launch.worker, fault::HeartbeatMonitor::Clock::now());
      events_[launch.worker] = events;
    }
    Status started = inner_->Start(launch, this);
    if (!started.ok()) {  // no exit follows: it is not watched
      MutexLock lock(&mu_);
      monitor_->Forget(launch.worker);
      events_.erase(launch.worker);
    }
    return started;
  }
  void Signal(int worker, fault::RankSignal signal) override { inner_->Signal(worker, signal); }

  void OnOutput(int worker, std::string line) override {
    Of(worker)->OnOutput(worker, std::move(line));
  }
  void OnReport(int worker, fault::Report report) override {
    Of(worker)->OnReport(worker, std::move(report));
  }
  void OnExit(int worker, fault::RankExit exit) override {
    fault::RankEvents* events = nullptr;
    {
      MutexLock lock(&mu_);
      monitor_->Forget(worker);  // it beats no more
      events = events_.at(worker);
      events_.erase(worker);
    }
    events->OnExit(worker, std::move(exit));
  }

  // The heartbeat options the supervisor gave `launch`, if any.
  static std::optional<fault::HeartbeatOptions> BeatsOf(const fault::RankLaunch& launch) {
    fault::HeartbeatOptions o;
    bool asked = false;
    for (const auto& [name, value] : launch.env) {
      const double v = std::strtod(value.c_str(), nullptr);
      if (name == kBeatTimeoutVariable) {
        o.timeout = fault::Seconds(v);
        asked = v > 0;
      } else if (name == kBeatFirstVariable) {
        o.first_beat = fault::Seconds(v);
      } else if (name == "KC_HEARTBEAT_PERIOD" && v > 0) {
        o.period = fault::Seconds(v);
      }
    }
    if (!asked) return std::nullopt;
    return o;
  }

 private:
  fault::RankEvents* Of(int worker) {
    MutexLock lock(&mu_);
    return events_.at(worker);
  }

  // Every half period: the silent ranks are killed, each after its why is in the store.
  void Loop() {
    MutexLock lock(&mu_);
    while (!stop_) {
      const std::vector<int> silent = monitor_->Check(fault::HeartbeatMonitor::Clock::now());
      std::vector<std::pair<int, std::string>> why;
      for (int w : silent) why.emplace_back(w, SilenceReason(*monitor_, w, options_));
      mu_.Unlock();
      for (const auto& [w, text] : why) {
        store_->Set(SilentKey(w), text).IgnoreError();  // the kill says the rest
        inner_->Signal(w, fault::RankSignal::kKill);
      }
      mu_.Lock();
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::nanoseconds>(options_.period / 2);
      while (!stop_ && std::chrono::steady_clock::now() < until) cv_.WaitUntil(&mu_, until);
    }
  }

  fault::ProcessLauncher* const inner_;
  comm::Store* const store_;
  const std::string dir_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ KC_GUARDED_BY(mu_) = false;
  std::optional<fault::HeartbeatMonitor> monitor_ KC_GUARDED_BY(mu_);
  fault::HeartbeatOptions options_ KC_GUARDED_BY(mu_);
  std::map<int, fault::RankEvents*> events_ KC_GUARDED_BY(mu_);
  std::thread thread_;
};

std::string StoreTokenFromEnvironment() {
  const char* token = std::getenv(kStoreTokenVariable);
  return token != nullptr ? token : "";
}

}  // namespace

BeatDir::~BeatDir() {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

Status BeatDir::Create() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      (fs::path(tmp != nullptr && *tmp != 0 ? tmp : "/tmp") / "kc-run-beats-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    return UnavailableError(fmt::format("{}: {}", templ, strerror(errno)));
  }
  path_ = templ;
  return OkStatus();
}

fault::HeartbeatOptions HeartbeatOptionsOf(const RunArgs& a) {
  return {.period = fault::Seconds(a.heartbeat_period_s),
          .timeout = fault::Seconds(a.heartbeat_timeout_s),
          .first_beat = fault::Seconds(a.heartbeat_first_s)};
}

std::string SilenceReason(const fault::HeartbeatMonitor& monitor, int rank,
                          const fault::HeartbeatOptions& options) {
  return fmt::format("sent no heartbeat for {:.1f} s ({}): declared failed and killed",
                     monitor.silent_for(rank).count(),
                     monitor.heard(rank)
                         ? fmt::format("--heartbeat-timeout {} s", options.timeout.count())
                         : fmt::format("none since its start; --heartbeat-first {} s",
                                       std::max(options.first_beat, options.timeout).count()));
}

Result<std::string> FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t at = 0;
  while (at <= dirs.size()) {
    size_t colon = dirs.find(':', at);
    if (colon == std::string::npos) colon = dirs.size();
    const std::string dir = dirs.substr(at, colon - at);
    const std::string candidate = (fs::path(dir.empty() ? "." : dir) / name).string();
    if (access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    at = colon + 1;
  }
  return NotFoundError(fmt::format("{}: not found on PATH", name));
}

Result<int> FreePort(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(address.c_str(), "0", &hints, &found); e != 0) {
    return InvalidArgumentError(fmt::format("{}: {}", address, gai_strerror(e)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> own(found, freeaddrinfo);
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return UnavailableError(fmt::format("socket: {}", strerror(errno)));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  const bool ok = bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0;
  const int error = errno;
  close(fd);
  if (!ok) return UnavailableError(fmt::format("no free port on {}: {}", address, strerror(error)));
  // sin_port and sin6_port sit at the same offset.
  return ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
}

std::string CheckHostsRunArgs(const RunArgs& a, bool nproc_given) {
  if (!AcrossHosts(a)) {
    if (!a.rendezvous.empty() || !a.listen.empty()) {
      return "--rendezvous and --listen are for a run across hosts (--hosts or --share)";
    }
    return "";
  }
  if (!a.hosts.empty() && !a.share.empty()) {
    return "--hosts starts the run's supervisor; --share a host's share of it: give one or the "
           "other";
  }
  if (!a.hosts.empty() && a.listen.empty() == a.rendezvous.empty()) {
    return "--hosts needs --listen ADDR[:PORT] (the address of this machine where the hosts reach "
           "the run's store) or --rendezvous ADDR:PORT (a store served elsewhere, as kcd serves "
           "one "
           "for each run), one of them";
  }
  if (!a.share.empty() && (a.rendezvous.empty() || !a.listen.empty())) {
    return "--share needs --rendezvous ADDR:PORT (the run's store), and no --listen";
  }
  if (nproc_given) return "--nproc: across hosts, --hosts gives each host's ranks (h1:2,h2:2)";
  // A failure ends a run across hosts: a cluster requeues the job, by its file's max_restarts.
  if (a.max_restarts > 0 || a.min_nproc > 0) {
    return fmt::format(
        "{}: not across hosts yet: a failed rank ends a run across hosts (on a cluster, kcd "
        "requeues the job by its max_restarts)",
        a.max_restarts > 0 ? "--max-restarts" : "--min-nproc");
  }
  return "";
}

int RunAcrossHosts(const RunArgs& a, int stop_fd) {
  auto fail = [](const std::string& what, int code) {
    std::cerr << "kc run: " << what << "\n";
    return code;
  };
  Result<std::vector<fault::RemoteHost>> hosts = ParseHostsFlag(a.hosts);
  if (!hosts.ok()) return fail(std::string(hosts.status().message()), kExitBadInput);
  int world = 0;
  for (const fault::RemoteHost& h : *hosts) world += h.slots;
  const std::string token = StoreTokenFromEnvironment();
  // The run's store: served elsewhere (kcd serves one for each run), or by this process.
  std::unique_ptr<comm::TcpStoreServer> server;
  std::string store_host;
  int store_port = 0;
  if (!a.listen.empty()) {
    int listen_port = 0;
    if (Status s = ParseListenFlag(a.listen, &store_host, &listen_port); !s.ok()) {
      return fail(std::string(s.message()), kExitBadInput);
    }
    Result<std::unique_ptr<comm::TcpStoreServer>> started = comm::TcpStoreServer::Start(
        {.bind_address = store_host, .port = listen_port, .token = token});
    if (!started.ok()) return fail(std::string(started.status().message()), kExitFailure);
    server = *std::move(started);
    store_port = server->port();
    std::cerr << fmt::format(
        "kc run: the run's store is at {}: start each host's share with kc run --share HOST "
        "--rendezvous {} -- PROGRAM ARGS\n",
        JoinHostPort(store_host, store_port), JoinHostPort(store_host, store_port));
  } else if (Status s = ParseHostPort(a.rendezvous, &store_host, &store_port);
             !s.ok() || store_port == 0) {
    return fail(fmt::format("--rendezvous: \"{}\" is not ADDR:PORT", a.rendezvous), kExitBadInput);
  }
  const TimePoint deadline = Clock::Real()->Now() + SecondsToDuration(a.timeout_s);
  // One connection for this thread, one for the launcher's (its thread polls the store).
  Result<std::unique_ptr<comm::TcpStoreClient>> mine = comm::TcpStoreClient::Connect(
      store_host, store_port, deadline, {.timeout = std::chrono::seconds(5), .token = token});
  Result<std::unique_ptr<comm::TcpStoreClient>> theirs = comm::TcpStoreClient::Connect(
      store_host, store_port, deadline, {.timeout = std::chrono::seconds(5), .token = token});
  if (!mine.ok() || !theirs.ok()) {
    return fail(std::string((mine.ok() ? theirs.status() : mine.status()).message()), kExitFailure);
  }
  std::unique_ptr<comm::Store> view = comm::WithPrefix(mine->get(), kRunPrefix);
  std::unique_ptr<comm::Store> launcher_view = comm::WithPrefix(theirs->get(), kRunPrefix);
  // Where rank 0's host says its TCPStore will listen: MASTER_ADDR and MASTER_PORT.
  const std::string first = hosts->front().name;
  Result<std::string> master = view->Get(AddressKey(first), deadline);
  if (master.status().code() == ErrorCode::kPermissionDenied) {
    return fail(fmt::format("the run's store refused this process: give it the store's token in "
                            "${} ({})",
                            kStoreTokenVariable, master.status().message()),
                kExitBadInput);
  }
  if (!master.ok()) {
    return fail(fmt::format("host {} (rank 0's) did not come up within {:.0f} s (--timeout): {}",
                            first, a.timeout_s, master.status().message()),
                kExitFailure);
  }
  std::string master_addr;
  int master_port = 0;
  if (Status s = ParseHostPort(*master, &master_addr, &master_port); !s.ok()) {
    return fail(fmt::format("host {} published \"{}\", not ADDR:PORT", first, *master),
                kExitFailure);
  }
  if (master_addr.size() > 2 && master_addr.front() == '[') {
    master_addr = master_addr.substr(1, master_addr.size() - 2);
  }
  Result<std::unique_ptr<fault::RemoteLauncher>> launcher = fault::RemoteLauncher::Create(
      {.store = launcher_view.get(), .hosts = *hosts, .share_timeout = kHostTimeout});
  if (!launcher.ok()) return fail(std::string(launcher.status().message()), kExitFailure);

  // Every rank with its part of the contract; a host's ranks are consecutive.
  RankQueue events;
  std::vector<std::string> host_of(static_cast<size_t>(world));
  int rank = 0;
  for (size_t h = 0; h < hosts->size(); ++h) {
    const fault::RemoteHost& host = (*hosts)[h];
    const fault::LaunchContract contract{.master_addr = master_addr,
                                         .master_port = master_port,
                                         .world_size = world,
                                         .local_world_size = host.slots,
                                         .group_rank = static_cast<int>(h),
                                         .first_rank = rank,
                                         .restart_count = a.restart_offset,
                                         .max_restarts = a.max_restarts,
                                         .run_id = a.run_id};
    for (int local = 0; local < host.slots; ++local, ++rank) {
      host_of[static_cast<size_t>(rank)] = host.name;
      fault::RankLaunch launch{
          .worker = rank,
          .env = fault::LaunchEnvironment(contract, local, /*omp_num_threads_set=*/false)};
      if (a.heartbeat_timeout_s > 0) {
        // The share watches its ranks' files (their heartbeats never leave their host).
        launch.env.insert(launch.env.end(),
                          {{"KC_HEARTBEAT_PERIOD", fmt::format("{}", a.heartbeat_period_s)},
                           {kBeatTimeoutVariable, fmt::format("{}", a.heartbeat_timeout_s)},
                           {kBeatFirstVariable, fmt::format("{}", a.heartbeat_first_s)}});
      }
      Status s = (*launcher)->Start(launch, &events);
      if (!s.ok()) {
        for (int r = 0; r < rank; ++r) (*launcher)->Signal(r, fault::RankSignal::kKill);
        return fail(std::string(s.message()), kExitFailure);
      }
    }
  }
  std::cerr << fmt::format("kc run: {} ranks on {} hosts (MASTER_ADDR {}, MASTER_PORT {})\n", world,
                           hosts->size(), master_addr, master_port);

  std::vector<bool> ended(static_cast<size_t>(world), false);
  int left = world;
  bool failed = false, stopped = false;
  double kill_at = 0;
  auto stop_all = [&](fault::RankSignal signal) {
    for (int r = 0; r < world; ++r) {
      if (!ended[static_cast<size_t>(r)]) (*launcher)->Signal(r, signal);
    }
  };
  while (left > 0) {
    pollfd fds[2] = {{.fd = events.fd(), .events = POLLIN, .revents = 0},
                     {.fd = stop_fd, .events = POLLIN, .revents = 0}};
    const int timeout_ms =
        kill_at > 0 ? std::max(0, static_cast<int>((kill_at - Now()) * 1000) + 1) : -1;
    if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR) {
      return fail(fmt::format("poll: {}", strerror(errno)), kExitFailure);
    }
    if (fds[1].revents != 0) {
      signalfd_siginfo info;
      if (read(stop_fd, &info, sizeof info) > 0 && !stopped) {
        std::cerr << fmt::format(
            "kc run: stopping on {} (SIGTERM to every rank, SIGKILL after {:.0f} s)\n",
            strsignal(static_cast<int>(info.ssi_signo)), a.grace_s);
        stopped = true;
        if (kill_at == 0) kill_at = Now() + a.grace_s;
        stop_all(fault::RankSignal::kStop);
      }
    }
    for (RankQueue::Event& e : events.Take()) {
      if (!e.exit) {
        std::cout << "[rank " << e.worker << "] " << e.line << "\n";
        continue;
      }
      ended[static_cast<size_t>(e.worker)] = true;
      --left;
      if (e.exit->ok || failed || stopped) continue;
      std::string why = e.exit->description;
      const std::string silent[1] = {SilentKey(e.worker)};
      if (Result<bool> has = view->Check(silent); has.ok() && *has) {
        // Its host's share killed it for its silence.
        Result<std::string> said =
            view->Get(silent[0], Clock::Real()->Now() + std::chrono::seconds(5));
        if (said.ok()) why = *said;
      }
      std::cerr << fmt::format("kc run: rank {} failed (host {}): {}\n", e.worker,
                               host_of[static_cast<size_t>(e.worker)], why);
      failed = true;
      kill_at = Now() + a.grace_s;
      stop_all(fault::RankSignal::kStop);
    }
    std::cout.flush();
    if (kill_at > 0 && Now() >= kill_at) {
      stop_all(fault::RankSignal::kKill);
      kill_at = 0;
    }
  }
  (*launcher)->Finish();
  launcher->reset();  // the shares end with their ranks
  if (stopped) return kExitStopped;
  if (failed) {
    return fail(
        "not restarted: across hosts, a failure ends the run (on a cluster, kcd requeues "
        "the job by its max_restarts)",
        kExitFailure);
  }
  return kExitOk;
}

int RunHostShareOfRun(const RunArgs& a, const std::string& program) {
  auto fail = [&](const std::string& what, int code) {
    std::cerr << "kc run: --share " << a.share << ": " << what << "\n";
    return code;
  };
  std::string store_host;
  int store_port = 0;
  if (Status s = ParseHostPort(a.rendezvous, &store_host, &store_port);
      !s.ok() || store_port == 0) {
    return fail(fmt::format("--rendezvous: \"{}\" is not ADDR:PORT", a.rendezvous), kExitBadInput);
  }
  // The token is this process's: its ranks do not inherit it.
  const std::string token = StoreTokenFromEnvironment();
  unsetenv(kStoreTokenVariable);
  // Calls fail fast: a share cut off from the store must notice within its fence.
  Result<std::unique_ptr<comm::TcpStoreClient>> client = comm::TcpStoreClient::Connect(
      store_host, store_port, Clock::Real()->Now() + SecondsToDuration(a.timeout_s),
      {.timeout = std::chrono::seconds(1), .token = token});
  if (!client.ok()) return fail(std::string(client.status().message()), kExitFailure);
  Result<std::string> address = LocalAddressTowards(store_host, store_port);
  if (!address.ok()) return fail(std::string(address.status().message()), kExitFailure);
  // Where rank 0's TCPStore listens if this host holds rank 0 (torchrun's MASTER_PORT is free
  // when chosen, as here; a program's store sets SO_REUSEADDR).
  Result<int> port = FreePort(*address);
  if (!port.ok()) return fail(std::string(port.status().message()), kExitFailure);
  std::unique_ptr<comm::Store> view = comm::WithPrefix(client->get(), kRunPrefix);
  if (Status s = view->Set(AddressKey(a.share), JoinHostPort(*address, *port)); !s.ok()) {
    return fail(s.code() == ErrorCode::kPermissionDenied
                    ? fmt::format("the run's store at {} refused this host: give it the "
                                  "store's token in ${} ({})",
                                  a.rendezvous, kStoreTokenVariable, s.message())
                    : std::string(s.message()),
                s.code() == ErrorCode::kPermissionDenied ? kExitBadInput : kExitFailure);
  }
  const bool omp_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  BeatDir beat_dir;
  if (Status s = beat_dir.Create(); !s.ok()) return fail(std::string(s.message()), kExitFailure);
  Result<std::unique_ptr<fault::LocalLauncher>> launcher = fault::LocalLauncher::Create(
      {.command =
           [&](const fault::RankLaunch& r) {
             SubprocessOptions o{.path = program,
                                 .argv = a.command,
                                 .env = r.env,
                                 .fds = {{.child = 0, .parent = ChildFd::kDevNull}},
                                 // Its helpers go with it; it goes if this share is killed.
                                 .group = SubprocessOptions::Group::kNew,
                                 .die_with_parent = true};
             if (omp_set) {
               std::erase_if(o.env, [](const auto& v) { return v.first == "OMP_NUM_THREADS"; });
             }
             if (BeatWatch::BeatsOf(r)) {
               // Heartbeats: its file here; the watch's own variables are not the program's.
               std::erase_if(o.env, [](const auto& v) {
                 return v.first == kBeatTimeoutVariable || v.first == kBeatFirstVariable;
               });
               o.env.emplace_back("KC_HEARTBEAT_FILE",
                                  fault::HeartbeatFile(beat_dir.path(), r.worker));
             }
             // This host's own checkpoint directory, the same over the job's runs.
             if (!a.checkpoint_dir.empty())
               o.env.emplace_back("KC_CHECKPOINT_DIR", a.checkpoint_dir);
             return o;
           },
       .stdout_as_output = true});
  if (!launcher.ok()) return fail(std::string(launcher.status().message()), kExitFailure);
  auto watch = std::make_unique<BeatWatch>(launcher->get(), view.get(), beat_dir.path());
  std::cerr << fmt::format(
      "kc run: --share {}: serving its ranks of the run at {} (this host is {} to the others)\n",
      a.share, a.rendezvous, *address);
  Status served = fault::ServeHostShare({.store = view.get(),
                                         .host = a.share,
                                         .launcher = watch.get(),
                                         .beat_period = kHostTimeout / 10,
                                         .fence_after = kHostTimeout});
  watch.reset();  // before the launcher it signals
  launcher->reset();
  if (!served.ok()) return fail(std::string(served.message()), kExitFailure);
  std::cerr << fmt::format("kc run: --share {}: the run is over\n", a.share);
  return kExitOk;
}

}  // namespace kc::app
