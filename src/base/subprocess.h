// Child processes: the one way this project starts a program. Everything the child needs
// (argv, the environment, its descriptors, its cores) is built before fork; after fork the child
// makes only async-signal-safe calls until exec. The parent holds a pidfd, so waiting and
// signalling never reach a process that reused the pid, and the child is killed (its process
// group, when it has one of its own) and reaped when the handle is destroyed, unless released.
//
//   KC_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Start({.path = "/proc/self/exe",
//                                                            .argv = {"kc", "train", ...}}));
//   KC_ASSIGN_OR_RETURN(int status, child.Wait());
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace kc {

// A descriptor of the child: `child` becomes a copy of this process's `parent`, or is closed
// in the child when `parent` is kClosed, or reads from /dev/null when it is kDevNull.
struct ChildFd {
  static constexpr int kClosed = -1;
  static constexpr int kDevNull = -2;
  int child = 0;
  int parent = kClosed;
};

struct SubprocessOptions {
  std::string path;               // the program, as given to execve (no PATH search)
  std::vector<std::string> argv;  // argv[0] included
  // The environment: this process's with `env` set over it (NAME, VALUE), or only `env` when
  // !inherit_env.
  std::vector<std::pair<std::string, std::string>> env;
  bool inherit_env = true;
  std::string working_dir;  // empty: this process's
  // Descriptors other than these are those of this process without FD_CLOEXEC (this project
  // opens everything with it, so in practice 0, 1 and 2).
  std::vector<ChildFd> fds;
  enum class Group {
    kInherit,     // in this process's process group (a signal to the group reaches it)
    kNew,         // a process group of its own, led by the child
    kNewSession,  // a session (and so a group) of its own: no controlling terminal
  };
  Group group = Group::kInherit;
  std::vector<int> cpus;  // the cores it may run on; empty: this process's
  // SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG): for workers that must not
  // outlive their launcher. Start it from a thread that lives as long as the child should.
  bool die_with_parent = false;
};

// "exited with status 3", "killed by signal 9 (Killed)": a waitpid status for people.
std::string DescribeWaitStatus(int status);

// A started child process. Move-only. Not thread-safe; owned by one thread at a time.
class Subprocess {
 public:
  // Forks and execs. The signal mask of the child is emptied (a caller that blocked signals
  // for sigwait would leave it deaf to them); ignored signals stay ignored (POSIX). kInternal
  // when fork or pidfd_open fails; an exec that fails makes the child exit with status 127.
  static Result<Subprocess> Start(const SubprocessOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Unless released or reaped: SIGKILL to its group (its own group) or to it, then reaps it.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Readable once the child has exited (poll it with the rest); -1 once reaped or released.
  int pidfd() const { return pidfd_; }
  bool reaped() const { return status_.has_value(); }
  // Its wait status, once reaped.
  std::optional<int> status() const { return status_; }

  // Blocks until the child exits (or `deadline` on `clock`: kDeadlineExceeded) and returns
  // its wait status; at once when it was reaped already.
  Result<int> Wait(TimePoint deadline = TimePoint::max(), Clock* clock = Clock::Real());
  // Its wait status if it has exited (reaping it), else nullopt.
  std::optional<int> TryWait();

  // Sends `signal` to the child (through its pidfd: never to a process that reused its pid).
  // Nothing once it was reaped.
  void Signal(int signal);
  // Sends `signal` to its process group when it leads one of its own (kNew, kNewSession):
  // also after it was reaped, to what is left of the group. Else as Signal.
  void SignalGroup(int signal);

  // Gives the child up: the destructor neither kills nor reaps it. Returns its pid.
  pid_t Release();

 private:
  Subprocess(pid_t pid, int pidfd, bool own_group)
      : pid_(pid), pidfd_(pidfd), own_group_(own_group) {}
  void Reset();

  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool own_group_ = false;
  std::optional<int> status_;
};

}  // namespace kc
