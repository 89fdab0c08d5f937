// LocalLauncher with shell scripts as ranks: what a rank writes and reports reaches the
// supervisor's side before its exit, and a stop or a kill reaches the rank.
#include "fault/local_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>

#include "base/mutex.h"

namespace kc::fault {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What the launcher delivered, per worker; waits for exits without sleeping.
class Inbox final : public RankEvents {
 public:
  struct Rank {
    std::vector<std::string> output;
    std::vector<Report> reports;
    std::optional<RankExit> exit;
    bool events_after_exit = false;
  };
  void OnOutput(int worker, std::string line) override {
    MutexLock lock(&mu_);
    ranks_[worker].events_after_exit |= ranks_[worker].exit.has_value();
    ranks_[worker].output.push_back(std::move(line));
    cv_.SignalAll();
  }
  void OnReport(int worker, Report report) override {
    MutexLock lock(&mu_);
    ranks_[worker].events_after_exit |= ranks_[worker].exit.has_value();
    ranks_[worker].reports.push_back(std::move(report));
  }
  void OnExit(int worker, RankExit exit) override {
    MutexLock lock(&mu_);
    ranks_[worker].exit = std::move(exit);
    cv_.SignalAll();
  }
  Rank WaitForExit(int worker) {
    MutexLock lock(&mu_);
    while (!ranks_[worker].exit) cv_.Wait(&mu_);
    return ranks_[worker];
  }
  std::string WaitForOutput(int worker) {
    MutexLock lock(&mu_);
    while (ranks_[worker].output.empty()) cv_.Wait(&mu_);
    return ranks_[worker].output.front();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::map<int, Rank> ranks_ KC_GUARDED_BY(mu_);
};

// Worker w runs scripts[w] with sh.
std::unique_ptr<LocalLauncher> Launcher(std::vector<std::string> scripts) {
  auto l = LocalLauncher::Create({.command = [scripts](const RankLaunch& r) {
    return SubprocessOptions{.path = "/bin/sh",
                             .argv = {"sh", "-c", scripts[static_cast<size_t>(r.worker)]}};
  }});
  KC_CHECK(l.ok()) << l.status();
  return *std::move(l);
}

TEST(LocalLauncherTest, WhatARankWritesAndReportsComesBeforeItsExit) {
  auto launcher =
      Launcher({R"(echo "starting" >&2; printf '%s\n' '{"type":"val","step":2,"loss":1.5}' >&3;
          printf 'not json\n' >&3; echo "last words" >&2; exit 3)"});
  Inbox inbox;
  ASSERT_TRUE(launcher->Start({.worker = 0}, &inbox).ok());
  const Inbox::Rank r = inbox.WaitForExit(0);
  EXPECT_THAT(r.output, ElementsAre("starting", "last words"));
  ASSERT_EQ(r.reports.size(), 1u);  // the line that is no report is left out
  const auto* val = std::get_if<EvaluationReport>(&r.reports[0]);
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(val->step, 2);
  EXPECT_EQ(val->loss, 1.5);
  EXPECT_FALSE(r.exit->ok);
  EXPECT_FALSE(r.exit->killed);
  EXPECT_EQ(r.exit->description, "exited with status 3");
  EXPECT_FALSE(r.events_after_exit);
}

// kc run's ranks: any program's stdout is output too, the launch's variables reach it, and what
// it leaves in its process group (a helper holding its output open) goes when it exits.
TEST(LocalLauncherTest, AProgramsStdoutComesBackAndItsGroupGoesWithIt) {
  auto launcher = LocalLauncher::Create({.command =
                                             [](const RankLaunch& r) {
                                               return SubprocessOptions{
                                                   .path = "/bin/sh",
                                                   .argv = {"sh", "-c",
                                                            "sleep 600 & echo out; echo err >&2; "
                                                            "echo \"rank $KC_TEST_RANK\""},
                                                   .env = r.env,
                                                   .group = SubprocessOptions::Group::kNew};
                                             },
                                         .stdout_as_output = true});
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  Inbox inbox;
  ASSERT_TRUE((*launcher)->Start({.worker = 0, .env = {{"KC_TEST_RANK", "7"}}}, &inbox).ok());
  const Inbox::Rank r = inbox.WaitForExit(0);  // not 600 s: the helper went with it
  EXPECT_THAT(r.output, ::testing::UnorderedElementsAre("out", "err", "rank 7"));
  EXPECT_TRUE(r.exit->ok) << r.exit->description;
}

TEST(LocalLauncherTest, AStopIsSigtermAndAKillIsSigkill) {
  // Worker 0 stops on SIGTERM (its trap exits 0); worker 1 is killed.
  auto launcher = Launcher({"trap 'exit 0' TERM; echo up >&2; while :; do sleep 1; done",
                            "echo up >&2; while :; do sleep 1; done"});
  Inbox inbox;
  ASSERT_TRUE(launcher->Start({.worker = 0}, &inbox).ok());
  ASSERT_TRUE(launcher->Start({.worker = 1, .join = true}, &inbox).ok());
  launcher->Signal(1, RankSignal::kKill);
  const Inbox::Rank killed = inbox.WaitForExit(1);
  EXPECT_TRUE(killed.exit->killed);
  EXPECT_THAT(killed.exit->description, HasSubstr("killed by signal 9"));
  EXPECT_EQ(inbox.WaitForOutput(0), "up");  // its trap is set
  launcher->Signal(0, RankSignal::kStop);
  const Inbox::Rank stopped = inbox.WaitForExit(0);
  EXPECT_TRUE(stopped.exit->ok) << stopped.exit->description;
  launcher->Signal(0, RankSignal::kKill);  // ended: nothing
}

TEST(LocalLauncherTest, DestroyingTheLauncherKillsItsRanks) {
  Inbox inbox;
  auto launcher = Launcher({"echo $$ >&2; exec sleep 1000"});
  ASSERT_TRUE(launcher->Start({.worker = 0}, &inbox).ok());
  const pid_t pid = static_cast<pid_t>(std::stoi(inbox.WaitForOutput(0)));
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  ASSERT_GE(pidfd, 0);
  launcher.reset();
  pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
  EXPECT_EQ(poll(&p, 1, 0), 1);  // it has ended (and was reaped) before the destructor returned
  close(pidfd);
}

}  // namespace
}  // namespace kc::fault
