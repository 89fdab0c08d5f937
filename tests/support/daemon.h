// Test support: a long-running child (kcd, `kc up`, `kc agent`) started from a shell command
// line, whose standard output is read line by line; stopped and reaped when the test leaves
// its scope, however it leaves (a failed assertion included): asked with SIGTERM first, so kc up
// and agents stop the jobs they started, then its whole process group killed. Header-only.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

namespace kc::testing {

class Daemon {
 public:
  // Runs `command` with /bin/sh (which execs it, so the child is the command itself when the
  // line is a single `exec`able command or `env ... cmd`, `ip netns exec ...`). Its stderr
  // goes to the test's stderr.
  explicit Daemon(const std::string& command) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);  // its own process group, so teardown reaches what it starts
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), nullptr);
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~Daemon() {
    if (pid_ > 0) {
      // Still running: the test left early. A graceful stop first (kc up stops its agent, which
      // stops its jobs, within their stop grace), then nothing of its group is left.
      kill(pid_, SIGTERM);
      const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
      if (pidfd >= 0) {
        pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
        poll(&p, 1, kGraceMs);
        close(pidfd);
      }
      kill(-pid_, SIGKILL);
      Stop(SIGKILL);
    }
    if (out_ != nullptr) std::fclose(out_);
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Reads lines of its output until one contains `text`; returns that line, or "" when the
  // output ends first (the child exited). Everything read is kept in output().
  std::string WaitForLine(std::string_view text) {
    char line[4096];
    while (out_ != nullptr && std::fgets(line, sizeof line, out_) != nullptr) {
      output_ += line;
      if (std::string_view(line).find(text) != std::string_view::npos) return line;
    }
    return "";
  }
  const std::string& output() const { return output_; }

  // Reads the rest of its output (kept in output()) and waits for its end: its exit code, as
  // Stop(0).
  int Finish() {
    WaitForLine(std::string_view("\0", 1));  // no line holds a NUL: reads to the end
    return Stop(0);
  }

  // Sends `sig`, waits for the child to end, and returns its exit code (-1 when a signal
  // ended it). Idempotent.
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return exit_code_;
  }
  pid_t pid() const { return pid_; }

 private:
  static constexpr int kGraceMs = 40000;  // longer than an agent's default stop grace (30 s)

  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  std::string output_;
  int exit_code_ = -1;
};

}  // namespace kc::testing
