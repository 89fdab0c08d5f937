#include "base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

extern char** environ;

namespace kc {
namespace {

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

int PidfdSendSignal(int pidfd, int signal) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
}

}  // namespace

std::string DescribeWaitStatus(int status) {
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

Result<Subprocess> Subprocess::Start(const SubprocessOptions& o) {
  if (o.path.empty() || o.argv.empty()) {
    return InvalidArgumentError("subprocess: a path and argv[0] are needed");
  }
  // Everything the child uses, built now: after fork only async-signal-safe calls.
  std::vector<std::string> args = o.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env;
  auto overridden = [&](std::string_view entry) {
    for (const auto& [name, value] : o.env) {
      if (entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=') {
        return true;
      }
    }
    return false;
  };
  if (o.inherit_env) {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      if (!overridden(*e)) env.emplace_back(*e);
    }
  }
  for (const auto& [name, value] : o.env) env.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : o.cpus) CPU_SET(c, &cpus);
  int dev_null = -1;
  int first_spare = 3;  // above every descriptor the child is to have
  for (const ChildFd& f : o.fds) {
    first_spare = std::max(first_spare, f.child + 1);
    if (f.parent == ChildFd::kDevNull && dev_null < 0) {
      dev_null = open("/dev/null", O_RDWR | O_CLOEXEC);
      if (dev_null < 0) return InternalError(Errno("subprocess: /dev/null"));
    }
  }
  std::vector<int> staged(o.fds.size(), -1);
  const char* dir = o.working_dir.empty() ? nullptr : o.working_dir.c_str();
  const pid_t parent = getpid();
  sigset_t none;
  sigemptyset(&none);

  const pid_t pid = fork();
  if (pid < 0) {
    const std::string why = Errno("subprocess: fork");
    if (dev_null >= 0) close(dev_null);
    return InternalError(why);
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls from here to exec.
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    if (o.group == SubprocessOptions::Group::kNew) setpgid(0, 0);
    if (o.group == SubprocessOptions::Group::kNewSession) setsid();
    if (o.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent is gone already
    }
    // Copies above every target first, so that one mapping cannot overwrite another's source.
    for (size_t i = 0; i < o.fds.size(); ++i) {
      const int from = o.fds[i].parent == ChildFd::kDevNull ? dev_null : o.fds[i].parent;
      if (from >= 0) staged[i] = fcntl(from, F_DUPFD_CLOEXEC, first_spare);
    }
    for (size_t i = 0; i < o.fds.size(); ++i) {
      if (staged[i] >= 0) {
        dup2(staged[i], o.fds[i].child);  // the copy is not close-on-exec
      } else {
        close(o.fds[i].child);
      }
    }
    if (!o.cpus.empty()) sched_setaffinity(0, sizeof(cpus), &cpus);
    if (dir != nullptr && chdir(dir) != 0) _exit(127);
    execve(o.path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (dev_null >= 0) close(dev_null);
  if (o.group == SubprocessOptions::Group::kNew)
    setpgid(pid, pid);  // also here: a signal to it may come first
  const int pidfd = PidfdOpen(pid);
  if (pidfd < 0) {
    const std::string why = Errno("subprocess: pidfd_open (Linux >= 5.3)");
    kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return InternalError(why);
  }
  return Subprocess(pid, pidfd, o.group != SubprocessOptions::Group::kInherit);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::exchange(other.pidfd_, -1)),
      own_group_(other.own_group_),
      status_(std::exchange(other.status_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Reset();
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::exchange(other.pidfd_, -1);
    own_group_ = other.own_group_;
    status_ = std::exchange(other.status_, std::nullopt);
  }
  return *this;
}

Subprocess::~Subprocess() { Reset(); }

void Subprocess::Reset() {
  if (pid_ > 0 && !status_) {
    if (own_group_) kill(-pid_, SIGKILL);
    Signal(SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd_ >= 0) close(pidfd_);
  pid_ = -1;
  pidfd_ = -1;
  status_.reset();
}

Result<int> Subprocess::Wait(TimePoint deadline, Clock* clock) {
  if (status_) return *status_;
  if (pid_ <= 0) return FailedPreconditionError("subprocess: released");
  while (!status_) {
    if (deadline != TimePoint::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock->Now());
      if (left.count() <= 0) return DeadlineExceededError("subprocess: still running");
      pollfd p{.fd = pidfd_, .events = POLLIN, .revents = 0};
      // The real clock bounds the wait; a fake one is read again after each slice.
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
      if (p.revents == 0) continue;
    }
    int status = 0;
    const pid_t r = waitpid(pid_, &status, deadline == TimePoint::max() ? 0 : WNOHANG);
    if (r == pid_) {
      status_ = status;
    } else if (r < 0 && errno != EINTR) {
      return InternalError(Errno("subprocess: waitpid"));
    }
  }
  close(pidfd_);
  pidfd_ = -1;
  return *status_;
}

std::optional<int> Subprocess::TryWait() {
  if (!status_ && pid_ > 0) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      status_ = status;
      close(pidfd_);
      pidfd_ = -1;
    }
  }
  return status_;
}

void Subprocess::Signal(int signal) {
  if (pidfd_ >= 0 && !status_) PidfdSendSignal(pidfd_, signal);
}

void Subprocess::SignalGroup(int signal) {
  if (own_group_ && pid_ > 0) {
    // The group id stays reserved while any member lives, so it names no other group. None
    // yet (a new session's child that has not reached its setsid, just after Start): the
    // child itself, which takes the signal into its exec or its group.
    if (kill(-pid_, signal) != 0 && errno == ESRCH) kill(pid_, signal);
  } else {
    Signal(signal);
  }
}

pid_t Subprocess::Release() {
  const pid_t pid = pid_;
  if (pidfd_ >= 0) close(pidfd_);
  pid_ = -1;
  pidfd_ = -1;
  return pid;
}

}  // namespace kc
