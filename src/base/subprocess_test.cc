#include "base/subprocess.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace kc {
namespace {

using ::testing::HasSubstr;

// A pipe whose ends close with it.
struct Pipe {
  Pipe() { EXPECT_EQ(pipe2(fd, O_CLOEXEC), 0); }
  ~Pipe() {
    CloseRead();
    CloseWrite();
  }
  void CloseRead() {
    if (fd[0] >= 0) close(fd[0]);
    fd[0] = -1;
  }
  void CloseWrite() {
    if (fd[1] >= 0) close(fd[1]);
    fd[1] = -1;
  }
  std::string ReadAll() {
    std::string out;
    char buf[256];
    for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;)
      out.append(buf, static_cast<size_t>(n));
    return out;
  }
  int fd[2] = {-1, -1};
};

SubprocessOptions Shell(const std::string& script) {
  return {.path = "/bin/sh", .argv = {"sh", "-c", script}};
}

TEST(SubprocessTest, WaitReturnsTheExitStatus) {
  Result<Subprocess> child = Subprocess::Start(Shell("exit 3"));
  ASSERT_TRUE(child.ok()) << child.status();
  Result<int> status = child->Wait();
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
  EXPECT_TRUE(child->reaped());
  EXPECT_EQ(child->pidfd(), -1);
  EXPECT_EQ(DescribeWaitStatus(*status), "exited with status 3");
}

TEST(SubprocessTest, TheChildGetsItsEnvironmentDescriptorsAndDirectory) {
  Pipe out;
  const std::string dir = std::filesystem::temp_directory_path().string();
  SubprocessOptions o = Shell("printf '%s %s ' \"$KC_SUBPROCESS_TEST\" \"$(pwd)\"; cat <&0");
  o.env = {{"KC_SUBPROCESS_TEST", "set-before-fork"}};
  o.working_dir = dir;
  o.fds = {{.child = 1, .parent = out.fd[1]}, {.child = 0, .parent = ChildFd::kDevNull}};
  Result<Subprocess> child = Subprocess::Start(o);
  ASSERT_TRUE(child.ok()) << child.status();
  out.CloseWrite();
  EXPECT_EQ(out.ReadAll(), "set-before-fork " + dir + " ");
  EXPECT_EQ(*child->Wait(), 0);
}

TEST(SubprocessTest, MappingsThatSwapDescriptorsDoNotOverwriteEachOther) {
  // The child's 1 comes from a descriptor that another mapping targets, and the other way round.
  Pipe a, b;
  SubprocessOptions o = Shell("echo one; echo two >&2");
  const int high_a = fcntl(a.fd[1], F_DUPFD_CLOEXEC, 20);
  const int high_b = fcntl(b.fd[1], F_DUPFD_CLOEXEC, 21);
  o.fds = {{.child = 2, .parent = high_a}, {.child = 1, .parent = high_b}};
  Result<Subprocess> child = Subprocess::Start(o);
  ASSERT_TRUE(child.ok());
  close(high_a);
  close(high_b);
  a.CloseWrite();
  b.CloseWrite();
  EXPECT_EQ(a.ReadAll(), "two\n");
  EXPECT_EQ(b.ReadAll(), "one\n");
  EXPECT_EQ(*child->Wait(), 0);
}

TEST(SubprocessTest, AProgramThatCannotRunExitsWith127) {
  Result<Subprocess> child =
      Subprocess::Start({.path = "/nonexistent/program", .argv = {"program"}});
  ASSERT_TRUE(child.ok());
  const int status = *child->Wait();
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 127);
  EXPECT_EQ(Subprocess::Start({.path = "", .argv = {}}).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(SubprocessTest, SignalsReachTheChildEvenWithThemBlockedHere) {
  // As kc agent does: SIGTERM blocked for sigwait. The child starts with an empty mask.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  Pipe in;
  SubprocessOptions o = Shell("read line");
  o.fds = {{.child = 0, .parent = in.fd[0]}};
  Result<Subprocess> child = Subprocess::Start(o);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(child.ok());
  EXPECT_FALSE(child->TryWait().has_value());  // blocked on its input
  child->Signal(SIGTERM);
  const int status = *child->Wait();
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_THAT(DescribeWaitStatus(status), HasSubstr("killed by signal 15"));
  child->Signal(SIGTERM);  // reaped: nothing
}

// A new session's child signalled the moment Start returns, before it may have reached its
// setsid (no group yet to signal): the signal still reaches it, many times over.
TEST(SubprocessTest, SignalGroupRightAfterStartReachesANewSessionsChild) {
  for (int i = 0; i < 50; ++i) {
    SubprocessOptions o = Shell("exec sleep 60");
    o.group = SubprocessOptions::Group::kNewSession;
    Result<Subprocess> child = Subprocess::Start(o);
    ASSERT_TRUE(child.ok());
    child->SignalGroup(SIGTERM);
    const int status = *child->Wait();
    ASSERT_TRUE(WIFSIGNALED(status)) << i << ": " << DescribeWaitStatus(status);
    EXPECT_EQ(WTERMSIG(status), SIGTERM);
  }
}

TEST(SubprocessTest, AWaitEndsAtItsDeadline) {
  FakeClock clock;
  Pipe in;
  SubprocessOptions o = Shell("read line");
  o.fds = {{.child = 0, .parent = in.fd[0]}};
  Result<Subprocess> child = Subprocess::Start(o);
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(child->Wait(clock.Now(), &clock).status().code(), ErrorCode::kDeadlineExceeded);
  in.CloseWrite();  // read fails: the shell exits 1
  EXPECT_EQ(WEXITSTATUS(*child->Wait()), 1);
}

// The pid of the background child the script prints, and a pidfd for it.
struct Grandchild {
  pid_t pid = -1;
  int pidfd = -1;
};

Grandchild StartWithGrandchild(SubprocessOptions::Group group, std::optional<Subprocess>* out) {
  Pipe pids;
  SubprocessOptions o = Shell("sleep 1000 & echo $!; wait");
  o.group = group;
  o.fds = {{.child = 1, .parent = pids.fd[1]}};
  Result<Subprocess> child = Subprocess::Start(o);
  EXPECT_TRUE(child.ok());
  pids.CloseWrite();
  char buf[32] = {};
  EXPECT_GT(read(pids.fd[0], buf, sizeof buf - 1), 0);
  Grandchild g;
  g.pid = static_cast<pid_t>(std::atoi(buf));
  g.pidfd = static_cast<int>(syscall(SYS_pidfd_open, g.pid, 0));
  EXPECT_GE(g.pidfd, 0);
  out->emplace(*std::move(child));
  return g;
}

// Whether the process of `pidfd` exits (a minute bounds the wait: a hung test fails instead).
bool Exited(int pidfd) {
  pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, 60'000) == 1;
}

TEST(SubprocessTest, DestroyingTheHandleKillsTheChildsWholeProcessGroup) {
  std::optional<Subprocess> child;
  const Grandchild g = StartWithGrandchild(SubprocessOptions::Group::kNew, &child);
  EXPECT_EQ(getpgid(g.pid), child->pid());
  child.reset();  // kills the group: the grandchild too
  EXPECT_TRUE(Exited(g.pidfd));
  close(g.pidfd);
}

TEST(SubprocessTest, AReleasedChildIsLeftRunning) {
  std::optional<Subprocess> child;
  const Grandchild g = StartWithGrandchild(SubprocessOptions::Group::kNewSession, &child);
  const pid_t pid = child->Release();
  child.reset();
  EXPECT_EQ(kill(pid, 0), 0);
  EXPECT_EQ(getsid(pid), pid);
  // Clean up by hand: the group, then the child.
  kill(-pid, SIGKILL);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(Exited(g.pidfd));
  close(g.pidfd);
}

TEST(SubprocessTest, SignalGroupReachesWhatIsLeftAfterTheLeaderWasReaped) {
  std::optional<Subprocess> child;
  const Grandchild g = StartWithGrandchild(SubprocessOptions::Group::kNew, &child);
  child->Signal(SIGKILL);  // the leader only
  EXPECT_TRUE(WIFSIGNALED(*child->Wait()));
  child->SignalGroup(SIGKILL);
  EXPECT_TRUE(Exited(g.pidfd));
  close(g.pidfd);
}

}  // namespace
}  // namespace kc
