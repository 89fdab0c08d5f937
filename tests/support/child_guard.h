// Test support: a forked child process that is killed and reaped when the test leaves its
// scope, however it leaves. Header-only.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

namespace kc::testing {

class ChildGuard {
 public:
  explicit ChildGuard(pid_t pid) : pid_(pid) {}
  ~ChildGuard() {
    if (pid_ > 0) KillAndReap();
  }
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;

  // Waits for the child to end by itself and returns its wait status.
  int Reap() {
    int wstatus = 0;
    waitpid(pid_, &wstatus, 0);
    pid_ = -1;
    return wstatus;
  }
  // Kills the child and returns its wait status.
  int KillAndReap() {
    kill(pid_, SIGKILL);
    return Reap();
  }

 private:
  pid_t pid_;
};

}  // namespace kc::testing
