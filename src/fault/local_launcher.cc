#include "fault/local_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace kc::fault {
namespace {

// Splits what a read of `fd` brings into lines, calling `f` with each whole one; at end of
// file the unfinished rest is a line too. Returns false at end of file.
bool ReadLines(int fd, std::string* partial, const std::function<void(const std::string&)>& f) {
  char buf[65536];
  const ssize_t n = read(fd, buf, sizeof(buf));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) {
    if (!partial->empty()) f(*partial);
    partial->clear();
    return false;
  }
  partial->append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = partial->find('\n', start)) != std::string::npos; start = nl + 1) {
    f(partial->substr(start, nl - start));
  }
  partial->erase(0, start);
  return true;
}

}  // namespace

class LocalLauncher::Impl {
 public:
  explicit Impl(LocalLauncherOptions o, int wake) : o_(std::move(o)), wake_(wake) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Impl() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    Wake();
    thread_.join();
    // The children's handles kill and reap whoever still runs.
    for (auto& c : children_) {
      if (c->err_fd >= 0) close(c->err_fd);
      if (c->report_fd >= 0) close(c->report_fd);
    }
    close(wake_);
  }

  Status Start(const RankLaunch& launch, RankEvents* events) {
    SubprocessOptions command = o_.command(launch);
    int err[2], rep[2];
    if (pipe2(err, O_CLOEXEC) != 0) return InternalError(std::string("pipe: ") + strerror(errno));
    if (pipe2(rep, O_CLOEXEC) != 0) {
      const int e = errno;
      close(err[0]);
      close(err[1]);
      return InternalError(std::string("pipe: ") + strerror(e));
    }
    command.fds.push_back({.child = STDERR_FILENO, .parent = err[1]});
    if (o_.stdout_as_output) command.fds.push_back({.child = STDOUT_FILENO, .parent = err[1]});
    command.fds.push_back({.child = kReportFd, .parent = rep[1]});
    Result<Subprocess> process = Subprocess::Start(command);
    close(err[1]);
    close(rep[1]);
    if (!process.ok()) {
      close(err[0]);
      close(rep[0]);
      return process.status();
    }
    auto child = std::make_unique<Child>(launch.worker, events, *std::move(process));
    child->own_group = command.group != SubprocessOptions::Group::kInherit;
    child->err_fd = err[0];
    child->report_fd = rep[0];
    {
      MutexLock lock(&mu_);
      children_.push_back(std::move(child));
    }
    Wake();
    return OkStatus();
  }

  void Signal(int worker, RankSignal signal) {
    MutexLock lock(&mu_);
    for (auto& c : children_) {
      if (c->worker != worker) continue;
      const int sig = signal == RankSignal::kKill ? SIGKILL : SIGTERM;
      if (c->own_group) {
        c->process.SignalGroup(sig);
      } else {
        c->process.Signal(sig);
      }
    }
  }

 private:
  struct Child {
    Child(int w, RankEvents* e, Subprocess p)
        : worker(w), events(e), process(std::move(p)), pidfd(process.pidfd()) {}
    const int worker;
    RankEvents* const events;  // the supervisor's: it outlives its ranks
    Subprocess process;        // guarded by mu_ (Signal and the reaping)
    // Owned by the thread.
    int pidfd = -1;          // -1 once reaped
    bool own_group = false;  // it leads a process group of its own
    int err_fd = -1;
    int report_fd = -1;
    std::string err_partial, report_partial;
  };

  void Wake() {
    const uint64_t one = 1;
    if (write(wake_, &one, sizeof one) < 0) {
      // The counter is saturated: the thread is awake already.
    }
  }

  void ReadErr(Child& c) {
    if (!ReadLines(c.err_fd, &c.err_partial,
                   [&](const std::string& l) { c.events->OnOutput(c.worker, l); })) {
      close(c.err_fd);
      c.err_fd = -1;
    }
  }
  void ReadReports(Child& c) {
    if (!ReadLines(c.report_fd, &c.report_partial, [&](const std::string& l) {
          const nlohmann::json j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
          if (j.is_discarded()) return;  // not ours: a worker's own use of the descriptor
          if (Result<Report> r = ReportFromJson(j); r.ok()) c.events->OnReport(c.worker, *r);
        })) {
      close(c.report_fd);
      c.report_fd = -1;
    }
  }
  // The child has exited: what it wrote comes first (its pipes end now: it held their only
  // write ends), then its exit.
  void Reap(Child& c) {
    if (c.own_group) {
      // What it left in its group goes with it.
      MutexLock lock(&mu_);
      c.process.SignalGroup(SIGKILL);
    }
    while (c.err_fd >= 0) ReadErr(c);
    while (c.report_fd >= 0) ReadReports(c);
    int status = 0;
    {
      MutexLock lock(&mu_);
      status = c.process.Wait().value_or(0);
    }
    c.pidfd = -1;
    c.events->OnExit(c.worker, {.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0,
                                .killed = WIFSIGNALED(status),
                                .description = DescribeWaitStatus(status)});
  }

  void Loop() {
    for (;;) {
      std::vector<Child*> live;
      {
        MutexLock lock(&mu_);
        if (stopping_) return;
        for (auto& c : children_) {
          if (c->pidfd >= 0 || c->err_fd >= 0 || c->report_fd >= 0) live.push_back(c.get());
        }
      }
      // One entry per descriptor: (child, which) where which is 0 stderr, 1 reports, 2 pidfd.
      std::vector<pollfd> fds = {{.fd = wake_, .events = POLLIN, .revents = 0}};
      std::vector<std::pair<Child*, int>> owner = {{nullptr, 0}};
      for (Child* c : live) {
        const int mine[3] = {c->err_fd, c->report_fd, c->pidfd};
        for (int which = 0; which < 3; ++which) {
          if (mine[which] < 0) continue;
          fds.push_back({.fd = mine[which], .events = POLLIN, .revents = 0});
          owner.emplace_back(c, which);
        }
      }
      if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      for (size_t k = 0; k < fds.size(); ++k) {
        if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        auto [c, which] = owner[k];
        if (c == nullptr) {
          uint64_t count;
          if (read(wake_, &count, sizeof count) < 0) {
            // Nothing to read: another wake-up took it.
          }
        } else if (which == 0 && c->err_fd >= 0) {
          ReadErr(*c);
        } else if (which == 1 && c->report_fd >= 0) {
          ReadReports(*c);
        } else if (which == 2 && c->pidfd >= 0) {
          Reap(*c);
        }
      }
    }
  }

  const LocalLauncherOptions o_;
  const int wake_;  // an eventfd: a child was added, or the launcher is being destroyed
  Mutex mu_;
  bool stopping_ KC_GUARDED_BY(mu_) = false;
  // Never shrinks while the thread runs, so the thread's pointers stay valid.
  std::vector<std::unique_ptr<Child>> children_ KC_GUARDED_BY(mu_);
  std::thread thread_;  // last: joined before the state it uses goes
};

Result<std::unique_ptr<LocalLauncher>> LocalLauncher::Create(LocalLauncherOptions options) {
  if (!options.command) return InvalidArgumentError("local launcher: no command");
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return InternalError(std::string("eventfd: ") + strerror(errno));
  return std::unique_ptr<LocalLauncher>(
      new LocalLauncher(std::make_unique<Impl>(std::move(options), wake)));
}

LocalLauncher::LocalLauncher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalLauncher::~LocalLauncher() = default;

Status LocalLauncher::Start(const RankLaunch& launch, RankEvents* events) {
  return impl_->Start(launch, events);
}

void LocalLauncher::Signal(int worker, RankSignal signal) { impl_->Signal(worker, signal); }

ReportPipe::ReportPipe() {
  if (fcntl(kReportFd, F_GETFD) != -1) fd_ = kReportFd;
}

ReportPipe::~ReportPipe() {
  if (fd_ >= 0) close(fd_);
}

void ReportPipe::OnReport(const Report& report) {
  if (fd_ < 0) return;
  const std::string line = ReportToJson(report).dump() + "\n";
  // One write a line (a pipe writes up to PIPE_BUF at once; longer lines come from this one
  // writer only, in order). A launcher that is gone (EPIPE) hears nothing more.
  for (size_t at = 0; at < line.size();) {
    const ssize_t n = write(fd_, line.data() + at, line.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

}  // namespace kc::fault
