// `kc run`: any program as N local ranks, started with the launch contract torchrun gives
// (fault/launch_env.h), so a PyTorch script runs under it unchanged; each rank's output
// prefixed by its rank; on a rank's failure (its exit, or with --heartbeat-timeout its
// heartbeats stopping) the others stopped and the whole group started again, up to
// --max-restarts times, as torchrun does, then with fewer ranks down to --min-nproc. Across
// hosts (--hosts, --share): apps/kc/run_hosts.h. Docs: docs/user-guide/pytorch.md.
#include "apps/kc/run_command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/kc/run_hosts.h"
#include "base/subprocess.h"
#include "fault/heartbeat.h"
#include "fault/launch_env.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Rank {
  std::optional<Subprocess> process;
  int out = -1;         // its stdout and stderr; -1 once at end of file
  std::string partial;  // a line not yet ended
  std::optional<int> status;
};

// How one attempt ended.
enum class End { kCompleted, kFailed, kStopped };

class Attempt {
 public:
  // `world` ranks; `beat_dir` is where they beat ("" without heartbeats).
  Attempt(const RunArgs& a, const std::string& program, int world, int restart, int stop_fd,
          const std::string& beat_dir)
      : a_(a),
        program_(program),
        world_(world),
        restart_(restart),
        stop_fd_(stop_fd),
        beat_dir_(beat_dir) {}
  ~Attempt() {
    for (Rank& r : ranks_) {
      if (r.out >= 0) close(r.out);
    }
  }

  // Starts the ranks and watches them until every one has ended.
  Result<End> Run() {
    KC_ASSIGN_OR_RETURN(const int port, FreePort("127.0.0.1"));
    const fault::LaunchContract contract{.master_port = port,
                                         .world_size = world_,
                                         .local_world_size = world_,
                                         .restart_count = a_.restart_offset + restart_,
                                         .max_restarts = a_.max_restarts,
                                         .run_id = a_.run_id,
                                         .checkpoint_dir = a_.checkpoint_dir,
                                         .heartbeat_dir = beat_dir_,
                                         .heartbeat_period_s = a_.heartbeat_period_s};
    const bool omp_set = std::getenv("OMP_NUM_THREADS") != nullptr;
    if (!beat_dir_.empty()) {
      // Each rank's file appears with its first beat: a previous attempt's must not count.
      for (int i = 0; i < a_.nproc; ++i) unlink(fault::HeartbeatFile(beat_dir_, i).c_str());
      beats_.emplace(
          [dir = beat_dir_](int r) { return fault::FileBeat(fault::HeartbeatFile(dir, r)); },
          world_, HeartbeatOptionsOf(a_), fault::HeartbeatMonitor::Clock::now());
    }
    ranks_.resize(static_cast<size_t>(world_));
    for (int i = 0; i < world_; ++i) {
      int pipefd[2];
      if (pipe2(pipefd, O_CLOEXEC) != 0) {
        StopAll(SIGKILL);
        return UnavailableError(fmt::format("pipe: {}", strerror(errno)));
      }
      Result<Subprocess> p =
          Subprocess::Start({.path = program_,
                             .argv = a_.command,
                             .env = fault::LaunchEnvironment(contract, i, omp_set),
                             .fds = {{.child = 0, .parent = ChildFd::kDevNull},
                                     {.child = 1, .parent = pipefd[1]},
                                     {.child = 2, .parent = pipefd[1]}},
                             // Its own group (its helpers, a data loader's workers, go with it),
                             // killed if kc run is.
                             .group = SubprocessOptions::Group::kNew,
                             .die_with_parent = true});
      close(pipefd[1]);
      ranks_[static_cast<size_t>(i)].out = pipefd[0];
      if (!p.ok()) {
        StopAll(SIGKILL);
        return p.status();
      }
      ranks_[static_cast<size_t>(i)].process = *std::move(p);
    }
    while (!AllDone()) {
      std::vector<pollfd> fds;
      std::vector<std::pair<int, bool>> what;  // rank, output (else its exit)
      for (size_t i = 0; i < ranks_.size(); ++i) {
        Rank& r = ranks_[i];
        if (r.out >= 0) {
          fds.push_back({.fd = r.out, .events = POLLIN, .revents = 0});
          what.emplace_back(static_cast<int>(i), true);
        }
        if (!r.status && r.process && r.process->pidfd() >= 0) {
          fds.push_back({.fd = r.process->pidfd(), .events = POLLIN, .revents = 0});
          what.emplace_back(static_cast<int>(i), false);
        }
      }
      fds.push_back({.fd = stop_fd_, .events = POLLIN, .revents = 0});
      int timeout_ms = -1;
      if (kill_at_ > 0) timeout_ms = std::max(0, static_cast<int>((kill_at_ - Now()) * 1000) + 1);
      if (Watching()) {
        // Heartbeats are checked every half period.
        const int check_ms = std::max(1, static_cast<int>(a_.heartbeat_period_s * 500));
        timeout_ms = timeout_ms < 0 ? check_ms : std::min(timeout_ms, check_ms);
      }
      if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
        return UnavailableError(fmt::format("poll: {}", strerror(errno)));
      }
      for (size_t k = 0; k + 1 < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        const auto [i, output] = what[k];
        if (output) {
          ReadOutput(i);
        } else {
          Reap(i);
        }
      }
      if (fds.back().revents != 0) {
        signalfd_siginfo info;
        if (read(stop_fd_, &info, sizeof info) > 0 && end_ != End::kStopped) {
          std::cerr << fmt::format(
              "kc run: stopping on {} (SIGTERM to every rank, SIGKILL after "
              "{:.0f} s)\n",
              strsignal(static_cast<int>(info.ssi_signo)), a_.grace_s);
          Stop(End::kStopped);
        }
      }
      if (Watching()) CheckHeartbeats();
      if (kill_at_ > 0 && Now() >= kill_at_) {
        StopAll(SIGKILL);
        kill_at_ = 0;
      }
    }
    return end_;
  }

  // The ranks whose failure (an exit, or silence) ended the attempt.
  int failed() const { return failed_; }

 private:
  // Whether heartbeats are watched: asked for, and no stop under way.
  bool Watching() const { return beats_.has_value() && end_ == End::kCompleted; }

  // A rank silent past the timeout is declared failed and killed (SIGTERM would not reach a
  // stopped process, nor help a wedged one); the others are stopped as after a failure.
  void CheckHeartbeats() {
    const std::vector<int> silent = beats_->Check(fault::HeartbeatMonitor::Clock::now());
    for (int i : silent) {
      Rank& r = ranks_[static_cast<size_t>(i)];
      if (r.status) continue;
      std::cerr << fmt::format("kc run: rank {} failed: {}\n", i,
                               SilenceReason(*beats_, i, HeartbeatOptionsOf(a_)));
      r.process->SignalGroup(SIGKILL);
      ++failed_;
    }
    if (failed_ > 0) Stop(End::kFailed);
  }

  bool AllDone() const {
    for (const Rank& r : ranks_) {
      if (!r.status || r.out >= 0) return false;
    }
    return true;
  }

  void ReadOutput(int i) {
    Rank& r = ranks_[static_cast<size_t>(i)];
    char buf[16384];
    const ssize_t n = read(r.out, buf, sizeof buf);
    if (n > 0) {
      r.partial.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = r.partial.find('\n')) != std::string::npos) {
        std::cout << "[rank " << i << "] " << std::string_view(r.partial).substr(0, nl + 1);
        r.partial.erase(0, nl + 1);
      }
      std::cout.flush();
      return;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (!r.partial.empty()) std::cout << "[rank " << i << "] " << r.partial << "\n" << std::flush;
    r.partial.clear();
    close(r.out);
    r.out = -1;
  }

  void Reap(int i) {
    Rank& r = ranks_[static_cast<size_t>(i)];
    r.status = r.process->TryWait();
    if (!r.status) return;
    // What the rank left in its group (helpers, a data loader's workers) goes with it: it would
    // hold the rank's output open, and kc run would wait on it.
    r.process->SignalGroup(SIGKILL);
    if (beats_) beats_->Forget(i);  // an ended rank beats no more
    const int s = *r.status;
    if (WIFEXITED(s) && WEXITSTATUS(s) == 0) return;
    if (end_ != End::kCompleted) return;  // stopping already: the others' ends follow
    std::cerr << fmt::format("kc run: rank {} failed: {}\n", i, DescribeWaitStatus(s));
    ++failed_;
    Stop(End::kFailed);
  }

  // SIGTERM to every rank still running, SIGKILL after the grace period.
  void Stop(End why) {
    end_ = why;
    StopAll(SIGTERM);
    kill_at_ = Now() + a_.grace_s;
  }

  void StopAll(int signal) {
    for (Rank& r : ranks_) {
      if (r.process && !r.status) r.process->SignalGroup(signal);
    }
  }

  const RunArgs& a_;
  const std::string& program_;
  const int world_;
  const int restart_;
  const int stop_fd_;
  const std::string& beat_dir_;
  std::vector<Rank> ranks_;
  std::optional<fault::HeartbeatMonitor> beats_;
  End end_ = End::kCompleted;
  int failed_ = 0;
  double kill_at_ = 0;
};

int RunRun(RunArgs a, bool nproc_given) {
  if (std::string why = CheckHostsRunArgs(a, nproc_given); !why.empty()) {
    std::cerr << "kc run: " << why << "\n";
    return kExitBadInput;
  }
  if (a.command.empty()) {
    std::cerr << "kc run: no program: give it after --, e.g. kc run --nproc 2 -- python3 "
                 "train.py\n";
    return kExitBadInput;
  }
  // The supervisor of a run across hosts starts no program here: each host's share finds it.
  Result<std::string> program = a.command[0];
  if (a.hosts.empty()) program = FindProgram(a.command[0]);
  if (!program.ok()) {
    std::cerr << "kc run: " << program.status().message() << "\n";
    return kExitBadInput;
  }
  if (a.min_nproc == 0) a.min_nproc = a.nproc;
  if (a.min_nproc > a.nproc) {
    std::cerr << fmt::format("kc run: --min-nproc {}: more than --nproc {}\n", a.min_nproc,
                             a.nproc);
    return kExitBadInput;
  }
  if (a.heartbeat_timeout_s > 0) {
    if (Status s = fault::ValidateHeartbeat(HeartbeatOptionsOf(a)); !s.ok()) {
      std::cerr << fmt::format("kc run: --heartbeat-timeout {} with --heartbeat-period {}: {}\n",
                               a.heartbeat_timeout_s, a.heartbeat_period_s, s.message());
      return kExitBadInput;
    }
  }
  if (a.run_id.empty()) a.run_id = fmt::format("kc-run-{}", getpid());
  if (!a.checkpoint_dir.empty()) {
    std::error_code ec;
    fs::create_directories(a.checkpoint_dir, ec);
    if (ec) {
      std::cerr << "kc run: --checkpoint-dir " << a.checkpoint_dir << ": " << ec.message() << "\n";
      return kExitBadInput;
    }
    a.checkpoint_dir = fs::absolute(a.checkpoint_dir).string();
  }
  if (!a.share.empty()) return RunHostShareOfRun(a, *program);
  // SIGTERM and SIGINT are read from a descriptor, beside the ranks' (the children start with
  // an empty mask).
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  sigprocmask(SIG_BLOCK, &stops, nullptr);
  const int stop_fd = signalfd(-1, &stops, SFD_CLOEXEC);
  if (stop_fd < 0) {
    std::cerr << "kc run: signalfd: " << strerror(errno) << "\n";
    return kExitFailure;
  }
  signal(SIGPIPE, SIG_IGN);
  if (!a.hosts.empty()) {
    const int code = RunAcrossHosts(a, stop_fd);
    close(stop_fd);
    return code;
  }
  BeatDir beat_dir;
  if (a.heartbeat_timeout_s > 0) {
    if (Status s = beat_dir.Create(); !s.ok()) {
      std::cerr << "kc run: heartbeat directory: " << s.message() << "\n";
      close(stop_fd);
      return kExitFailure;
    }
  }
  int code = kExitFailure;
  int world = a.nproc;
  for (int restart = 0;;) {
    Attempt attempt(a, *program, world, restart, stop_fd, beat_dir.path());
    Result<End> end = attempt.Run();
    if (!end.ok()) {
      std::cerr << "kc run: " << end.status().message() << "\n";
      break;
    }
    if (*end == End::kCompleted) {
      code = kExitOk;
      break;
    }
    if (*end == End::kStopped) {
      code = kExitStopped;
      break;
    }
    if (restart < a.max_restarts) {
      ++restart;
      std::cerr << fmt::format("kc run: restarting every rank (restart {} of {})\n", restart,
                               a.max_restarts);
      continue;
    }
    // No restart left: the survivors go on as a smaller group (a change of membership, which
    // torchrun does not count as a restart either), down to --min-nproc.
    const int survivors = world - std::max(1, attempt.failed());
    if (survivors < a.min_nproc || survivors < 1) {
      std::cerr << fmt::format("kc run: not restarted: {} restart{} done, --max-restarts {}{}\n",
                               restart, restart == 1 ? "" : "s", a.max_restarts,
                               a.min_nproc < a.nproc
                                   ? fmt::format("; {} rank{} would be left, --min-nproc {}",
                                                 survivors, survivors == 1 ? "" : "s", a.min_nproc)
                                   : "");
      break;
    }
    std::cerr << fmt::format(
        "kc run: no restart left (--max-restarts {}); going on with {} of {} ranks "
        "(--min-nproc {})\n",
        a.max_restarts, survivors, a.nproc, a.min_nproc);
    world = survivors;
  }
  close(stop_fd);
  return code;
}

}  // namespace

void AddRunCommand(CLI::App& app, Action* action) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand(
      "run",
      "Run any program as N ranks, on this machine or across hosts (--hosts, --share), with the "
      "launch environment torchrun gives (MASTER_ADDR, RANK, WORLD_SIZE, LOCAL_RANK, "
      "TORCHELASTIC_RESTART_COUNT, ...): kc run --nproc 2 -- python3 train.py");
  CLI::Option* nproc = c->add_option("--nproc", a->nproc, "Ranks to start")
                           ->check(CLI::Range(1, 4096))
                           ->capture_default_str();
  c->add_option("--min-nproc", a->min_nproc,
                "Go on with fewer ranks, down to this many, when a rank fails and no restart is "
                "left: the survivors start again as a smaller group (default --nproc: never)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--max-restarts", a->max_restarts,
                "When a rank fails, stop the others and start every rank again, at most this "
                "many times (TORCHELASTIC_RESTART_COUNT counts them)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  c->add_option("--grace", a->grace_s,
                "Seconds between SIGTERM and SIGKILL when ranks are stopped (a rank failed, or "
                "kc run got SIGTERM or SIGINT)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  c->add_option("--heartbeat-timeout", a->heartbeat_timeout_s,
                "Declare a rank failed (and kill it) when its heartbeat file, KC_HEARTBEAT_FILE, "
                "has not been touched for this many seconds; kc's torch backend touches it, "
                "another program must (default 0: no heartbeats)")
      ->check(CLI::Range(0.0, 86400.0));
  c->add_option("--heartbeat-period", a->heartbeat_period_s,
                "Seconds between a rank's heartbeats, given to it as KC_HEARTBEAT_PERIOD")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  c->add_option("--heartbeat-first", a->heartbeat_first_s,
                "Seconds a rank has from its start to its first heartbeat (imports, loading data)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  c->add_option("--checkpoint-dir", a->checkpoint_dir,
                "A directory that lasts over restarts, given to every rank as KC_CHECKPOINT_DIR");
  c->add_option("--run-id", a->run_id, "TORCHELASTIC_RUN_ID (default kc-run-PID)");
  c->add_option("--restart-offset", a->restart_offset,
                "Restarts before this run (kc agent gives a requeued job's count): "
                "TORCHELASTIC_RESTART_COUNT starts here")
      ->check(CLI::Range(0, 1000000));
  c->add_option("--hosts", a->hosts,
                "Across hosts: supervise a run of these hosts' ranks, HOST:RANKS in rank order "
                "(h1:2,h2:2); each host runs kc run --share HOST with the same program")
      ->group("Across hosts");
  c->add_option("--share", a->share,
                "Across hosts: run this host's ranks of the run whose store --rendezvous names")
      ->group("Across hosts");
  c->add_option("--rendezvous", a->rendezvous,
                "Across hosts: ADDR:PORT of the run's store (kcd serves one for each run; its "
                "token in $KC_RENDEZVOUS_TOKEN)")
      ->group("Across hosts");
  c->add_option("--listen", a->listen,
                "Across hosts, with --hosts: serve the run's store on ADDR[:PORT] of this machine")
      ->group("Across hosts");
  c->add_option("--timeout", a->timeout_s,
                "Across hosts: seconds to reach the run's store and for rank 0's host to come up")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str()
      ->group("Across hosts");
  c->add_option("command", a->command, "The program and its arguments (after --)")->required();
  c->callback([action, a, nproc] {
    const bool nproc_given = nproc->count() > 0;
    *action = [a, nproc_given] { return RunRun(*a, nproc_given); };
  });
}

}  // namespace kc::app
