// `kc run`: any program as N local ranks, started with the launch contract torchrun gives
// (fault/launch_env.h), so a PyTorch script runs under it unchanged; each rank's output
// prefixed by its rank; on a rank's failure the others stopped and the whole group started
// again, up to --max-restarts times, as torchrun does. Docs: docs/user-guide/run.md.
#include "apps/kc/run_command.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
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

#include "base/subprocess.h"
#include "fault/launch_env.h"

namespace kc::app {
namespace {

namespace fs = std::filesystem;

// The exit code when SIGTERM or SIGINT stopped the run (128 + SIGTERM, as a shell reports).
constexpr int kExitStopped = 128 + SIGTERM;

struct RunArgs {
  int nproc = 1;
  int max_restarts = 0;
  int restart_offset = 0;  // restarts before this kc run (a cluster's requeues)
  double grace_s = 30;
  std::string checkpoint_dir;
  std::string run_id;
  std::vector<std::string> command;
};

// `name` as execve needs it: itself when it names a path, else the first executable of that
// name on $PATH.
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

// A port free now on 127.0.0.1, for rank 0's store (torchrun picks MASTER_PORT the same way).
Result<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return UnavailableError(fmt::format("socket: {}", strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  if (!ok) return UnavailableError(fmt::format("no free port on 127.0.0.1: {}", strerror(errno)));
  return ntohs(a.sin_port);
}

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
  Attempt(const RunArgs& a, const std::string& program, int restart, int stop_fd)
      : a_(a), program_(program), restart_(restart), stop_fd_(stop_fd) {}
  ~Attempt() {
    for (Rank& r : ranks_) {
      if (r.out >= 0) close(r.out);
    }
  }

  // Starts the ranks and watches them until every one has ended.
  Result<End> Run() {
    KC_ASSIGN_OR_RETURN(const int port, FreePort());
    const fault::LaunchContract contract{.master_port = port,
                                         .world_size = a_.nproc,
                                         .local_world_size = a_.nproc,
                                         .restart_count = a_.restart_offset + restart_,
                                         .max_restarts = a_.max_restarts,
                                         .run_id = a_.run_id,
                                         .checkpoint_dir = a_.checkpoint_dir};
    const bool omp_set = std::getenv("OMP_NUM_THREADS") != nullptr;
    ranks_.resize(static_cast<size_t>(a_.nproc));
    for (int i = 0; i < a_.nproc; ++i) {
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
      if (kill_at_ > 0 && Now() >= kill_at_) {
        StopAll(SIGKILL);
        kill_at_ = 0;
      }
    }
    return end_;
  }

 private:
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
    const int s = *r.status;
    if (WIFEXITED(s) && WEXITSTATUS(s) == 0) return;
    if (end_ != End::kCompleted) return;  // stopping already: the others' ends follow
    std::cerr << fmt::format("kc run: rank {} failed: {}\n", i, DescribeWaitStatus(s));
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
  const int restart_;
  const int stop_fd_;
  std::vector<Rank> ranks_;
  End end_ = End::kCompleted;
  double kill_at_ = 0;
};

int RunRun(RunArgs a) {
  if (a.command.empty()) {
    std::cerr << "kc run: no program: give it after --, e.g. kc run --nproc 2 -- python3 "
                 "train.py\n";
    return kExitBadInput;
  }
  Result<std::string> program = FindProgram(a.command[0]);
  if (!program.ok()) {
    std::cerr << "kc run: " << program.status().message() << "\n";
    return kExitBadInput;
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
  int code = kExitFailure;
  for (int restart = 0;; ++restart) {
    Attempt attempt(a, *program, restart, stop_fd);
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
    if (restart >= a.max_restarts) {
      std::cerr << fmt::format("kc run: not restarted: {} restart{} done, --max-restarts {}\n",
                               restart, restart == 1 ? "" : "s", a.max_restarts);
      break;
    }
    std::cerr << fmt::format("kc run: restarting every rank (restart {} of {})\n", restart + 1,
                             a.max_restarts);
  }
  close(stop_fd);
  return code;
}

}  // namespace

void AddRunCommand(CLI::App& app, Action* action) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand(
      "run",
      "Run any program as N local ranks with the launch environment torchrun gives (MASTER_ADDR, "
      "RANK, WORLD_SIZE, LOCAL_RANK, TORCHELASTIC_RESTART_COUNT, ...): kc run --nproc 2 -- "
      "python3 train.py");
  c->add_option("--nproc", a->nproc, "Ranks to start")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
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
  c->add_option("--checkpoint-dir", a->checkpoint_dir,
                "A directory that lasts over restarts, given to every rank as KC_CHECKPOINT_DIR");
  c->add_option("--run-id", a->run_id, "TORCHELASTIC_RUN_ID (default kc-run-PID)");
  c->add_option("--restart-offset", a->restart_offset,
                "Restarts before this run (kc agent gives a requeued job's count): "
                "TORCHELASTIC_RESTART_COUNT starts here")
      ->check(CLI::Range(0, 1000000));
  c->add_option("command", a->command, "The program and its arguments (after --)")->required();
  c->callback([action, a] { *action = [a] { return RunRun(*a); }; });
}

}  // namespace kc::app
