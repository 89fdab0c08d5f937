// MeasureHostLoad against processes made to load a core: the run's, and another one beside it.
#include "hal/host_load.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include "tests/support/child_guard.h"

namespace kc::hal {
namespace {

// A child spinning on `cpu`, in a child of its own when `nested` (a launcher and its rank),
// in a process group of its own.
pid_t Spin(int cpu, bool nested) {
  const pid_t pid = fork();
  if (pid != 0) {
    setpgid(pid, pid);  // also here: the group is there before a kill of it
    return pid;
  }
  setpgid(0, 0);
  if (nested && fork() != 0) {
    for (;;) pause();  // the launcher: idle, unpinned
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  sched_setaffinity(0, sizeof one, &one);
  for (volatile unsigned long spin = 0;; spin = spin + 1) {
  }
}

// Kills a process group when the test leaves, however it leaves.
struct GroupGuard {
  pid_t group;
  ~GroupGuard() { kill(-group, SIGKILL); }
};

int FirstCpu() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  sched_getaffinity(0, sizeof mine, &mine);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) return c;
  }
  return 0;
}

// The run (a launcher whose rank spins on one core) and an intruder on the same core: the
// run's core is the rank's, found from its affinity; it is busy, the run has part of it, and
// the intruder is named with its share.
TEST(HostLoadTest, NamesAnotherProcessOnTheRunsCore) {
  const int cpu = FirstCpu();
  const pid_t launcher = Spin(cpu, /*nested=*/true);
  testing::ChildGuard launcher_guard(launcher);
  GroupGuard rank_guard{launcher};  // the rank too (destroyed first)
  const pid_t intruder = Spin(cpu, /*nested=*/false);
  testing::ChildGuard intruder_guard(intruder);
  // The rank forks from the launcher: measure until it is seen (a few tries at most).
  Result<HostLoad> load = UnavailableError("not measured");
  for (int i = 0; i < 20; ++i) {
    load = MeasureHostLoad({.roots = {launcher}});
    ASSERT_TRUE(load.ok()) << load.status();
    if (load->run_processes == 2 && load->cores.size() == 1) break;
  }
  ASSERT_EQ(load->run_processes, 2);
  ASSERT_EQ(load->cores.size(), 1u);
  const CoreLoad& core = load->cores[0];
  EXPECT_EQ(core.cpu, cpu);
  EXPECT_GT(core.busy, 0.9);
  EXPECT_GT(core.run, 0.2);
  EXPECT_LT(core.run, 0.8);  // shared with the intruder
  EXPECT_GT(core.sgemm_flops, 1e8);
  EXPECT_GT(load->copy_bytes_per_s, 1e8);
  ASSERT_FALSE(load->others.empty());
  EXPECT_EQ(load->others[0].pid, intruder);
  EXPECT_GT(load->others[0].cpu_share, 0.2);
  EXPECT_EQ(load->others[0].cpu, cpu);
  EXPECT_FALSE(load->others[0].command.empty());
}

TEST(HostLoadTest, BadInputIsRefused) {
  EXPECT_EQ(MeasureHostLoad({}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(MeasureHostLoad({.roots = {getpid()}, .window = std::chrono::milliseconds(1)})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
  // A process that has ended.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  testing::ChildGuard(gone).Reap();
  EXPECT_EQ(MeasureHostLoad({.roots = {gone}}).status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kc::hal
