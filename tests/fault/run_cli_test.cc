// `kc run` as a user runs it: any program as N ranks with torchrun's launch environment, each
// rank's output prefixed, a failed rank stopping the others and restarting the group by policy,
// SIGTERM stopping every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/daemon.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class KcRunTest : public ::testing::Test {
 protected:
  KcRunTest() : dir_("kc_run") {}

  // An executable shell script in the test's directory.
  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = dir_.Write(name, "#!/bin/sh\n" + body);
    EXPECT_EQ(chmod(path.c_str(), 0755), 0);
    return path;
  }
  testing::KcRun Run(const std::string& args) { return testing::RunKc(KC_BINARY, "run " + args); }

  testing::TempDir dir_;
};

// Rank 1 fails in the first run only: every rank is started again with the restart counted,
// the same contract otherwise, and the run succeeds.
TEST_F(KcRunTest, AFailedRankRestartsTheGroupWithItsRestartCount) {
  const std::string job = Script(
      "job.sh",
      "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE group=$GROUP_RANK "
      "addr=$MASTER_ADDR restart=$TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS "
      "id=$TORCHELASTIC_RUN_ID ckpt=$KC_CHECKPOINT_DIR port=$MASTER_PORT\"\n"
      "if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then\n"
      "  echo 'rank 1 gives up' >&2; exit 3\n"
      "fi\n");
  testing::KcRun r = Run("--nproc 2 --max-restarts 2 --run-id job-9 --checkpoint-dir " +
                         dir_.Path("ckpt") + " -- " + job);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // (Rank 0 of the first run may be stopped before it says anything.)
  for (const char* line :
       {"[rank 1] rank=1 world=2 local=1/2 group=0 addr=127.0.0.1 restart=0/2 id=job-9",
        "[rank 1] rank 1 gives up",
        "[rank 0] rank=0 world=2 local=0/2 group=0 addr=127.0.0.1 restart=1/2 id=job-9",
        "[rank 1] rank=1 world=2 local=1/2 group=0 addr=127.0.0.1 restart=1/2 id=job-9"}) {
    EXPECT_THAT(r.out, HasSubstr(line));
  }
  EXPECT_THAT(r.out, HasSubstr("ckpt=" + dir_.Path("ckpt") + " port="));
  EXPECT_THAT(r.out, Not(HasSubstr("restart=2/2")));
  EXPECT_THAT(r.err, HasSubstr("kc run: rank 1 failed: exited with status 3"));
  EXPECT_THAT(r.err, HasSubstr("kc run: restarting every rank (restart 1 of 2)"));
}

// Without restarts left, a failed rank ends the run: the rank still running is stopped (it would
// sleep a minute), and kc run fails.
TEST_F(KcRunTest, AFailureWithNoRestartLeftStopsTheOthersAndFails) {
  const std::string job = Script("job.sh",
                                 "if [ \"$RANK\" = 1 ]; then exit 5; fi\n"
                                 "exec sleep 60\n");
  testing::KcRun r = Run("--nproc 2 --grace 5 -- " + job);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("kc run: rank 1 failed: exited with status 5"));
  EXPECT_THAT(r.err, HasSubstr("kc run: not restarted: 0 restarts done, --max-restarts 0"));
}

// SIGTERM to kc run (a scheduler taking the machine back) reaches every rank; kc run reports
// the stop as a shell would (143).
TEST_F(KcRunTest, SigtermStopsEveryRank) {
  const std::string job = Script("job.sh", "echo \"up $RANK\"\nexec sleep 60\n");
  testing::Daemon run(std::string(KC_BINARY) + " run --nproc 3 --grace 5 -- " + job);
  for (const char* up : {"up 0", "up 1", "up 2"}) {
    (void)up;
    ASSERT_THAT(run.WaitForLine("] up "), HasSubstr("up ")) << run.output();
  }
  EXPECT_EQ(run.Stop(SIGTERM), 128 + SIGTERM) << run.output();
}

// A rank that ends leaving a helper behind (holding its output open) does not keep kc run
// waiting: the helper goes with the rank's group.
TEST_F(KcRunTest, WhatARankLeavesBehindGoesWithIt) {
  const std::string job = Script("job.sh", "sleep 60 &\necho \"done $RANK\"\n");
  testing::KcRun r = Run("--nproc 2 -- " + job);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 1] done 1"), std::string::npos) << r.out;
}

// With --heartbeat-timeout each rank touches KC_HEARTBEAT_FILE; rank 1 stops itself (SIGSTOP:
// alive, not running, as a wedged process) in the first run: it is declared failed, killed, and
// the group restarted. A rank that never beats is found after --heartbeat-first.
TEST_F(KcRunTest, ARankWhoseHeartbeatsStopIsKilledAndTheGroupRestarted) {
  const std::string job = Script(
      "job.sh",
      "touch \"$KC_HEARTBEAT_FILE\"\n"
      "echo \"beat $RANK restart=$TORCHELASTIC_RESTART_COUNT period=$KC_HEARTBEAT_PERIOD\"\n"
      "if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then kill -STOP $$; fi\n");
  testing::KcRun r =
      Run("--nproc 2 --max-restarts 1 --heartbeat-timeout 1 --heartbeat-period 0.2 "
          "--grace 5 -- " +
          job);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 1] beat 1 restart=0 period=0.2"));
  EXPECT_THAT(r.out, HasSubstr("[rank 1] beat 1 restart=1 period=0.2"));
  EXPECT_THAT(r.err, HasSubstr("kc run: rank 1 failed: sent no heartbeat for "));
  EXPECT_THAT(r.err, HasSubstr("(--heartbeat-timeout 1 s): declared failed and killed"));
  EXPECT_THAT(r.err, HasSubstr("kc run: restarting every rank (restart 1 of 1)"));

  const std::string mute =
      Script("mute.sh", "if [ \"$RANK\" = 0 ]; then exit 0; fi\nexec sleep 60\n");
  testing::KcRun m =
      Run("--nproc 2 --heartbeat-timeout 1 --heartbeat-period 0.2 "
          "--heartbeat-first 2 --grace 5 -- " +
          mute);
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  EXPECT_THAT(m.err, HasSubstr("none since its start; --heartbeat-first 2 s"));
  EXPECT_THAT(m.err, HasSubstr("kc run: rank 1 failed: sent no heartbeat for "));
  // Rank 0 ended without a beat: an ended rank is watched no more.
  EXPECT_THAT(m.err, Not(HasSubstr("kc run: rank 0 failed")));
}

// --min-nproc: once no restart is left, the survivors start again as a smaller group (a new
// WORLD_SIZE, the restart count unchanged), down to the minimum; below it, kc run fails.
TEST_F(KcRunTest, WithNoRestartLeftTheSurvivorsGoOnDownToMinNproc) {
  const std::string job =
      Script("job.sh",
             "if [ \"$WORLD_SIZE\" = 3 ] && [ \"$RANK\" = 2 ]; then exit 4; fi\n"
             "echo \"ok $RANK of $WORLD_SIZE local=$LOCAL_WORLD_SIZE "
             "restart=$TORCHELASTIC_RESTART_COUNT\"\n");
  testing::KcRun r = Run("--nproc 3 --min-nproc 2 --max-restarts 1 --grace 5 -- " + job);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("kc run: restarting every rank (restart 1 of 1)"));
  EXPECT_THAT(r.err,
              HasSubstr("kc run: no restart left (--max-restarts 1); going on with 2 of 3 ranks "
                        "(--min-nproc 2)"));
  EXPECT_THAT(r.out, HasSubstr("[rank 0] ok 0 of 2 local=2 restart=1"));
  EXPECT_THAT(r.out, HasSubstr("[rank 1] ok 1 of 2 local=2 restart=1"));

  const std::string always = Script("always.sh", "if [ \"$RANK\" = 1 ]; then exit 4; fi\n");
  testing::KcRun f = Run("--nproc 3 --min-nproc 2 --grace 5 -- " + always);
  EXPECT_EQ(f.exit_code, 1) << f.out << f.err;
  EXPECT_THAT(f.err, HasSubstr("going on with 2 of 3 ranks (--min-nproc 2)"));
  EXPECT_THAT(f.err, HasSubstr("kc run: not restarted: 0 restarts done, --max-restarts 0; 1 rank "
                               "would be left, --min-nproc 2"));
}

// Across hosts on one machine: a supervisor serving the run's store, and the shares of hosts
// "a" (2 ranks) and "b" (1 rank). Every rank gets its part of the contract (RANK counted over
// the hosts, its host's LOCAL_RANK and LOCAL_WORLD_SIZE, GROUP_RANK, rank 0's host as
// MASTER_ADDR, its host's checkpoint directory), its output reaches the supervisor prefixed by
// its rank, and the store's token is not passed on.
class KcRunHostsTest : public KcRunTest {
 protected:
  // Starts the supervisor of `hosts` and returns the store's address it says.
  std::string StartSupervisor(const std::string& hosts, const std::string& job,
                              const std::string& flags = "") {
    supervisor_ = std::make_unique<testing::Daemon>(
        std::string("env KC_RENDEZVOUS_TOKEN=secret ") + KC_BINARY + " run --hosts " + hosts +
        " --listen 127.0.0.1 --run-id r7 --grace 5 " + flags + " -- " + job + " 2>&1");
    const std::string line = supervisor_->WaitForLine("the run's store is at ");
    const size_t at = line.find("127.0.0.1:");
    EXPECT_NE(at, std::string::npos) << supervisor_->output();
    return line.substr(at, line.find(':', at + 10) - at);
  }
  std::unique_ptr<testing::Daemon> Share(const std::string& host, const std::string& store,
                                         const std::string& job) {
    return std::make_unique<testing::Daemon>(
        std::string("env KC_RENDEZVOUS_TOKEN=secret ") + KC_BINARY + " run --share " + host +
        " --rendezvous " + store + " --checkpoint-dir " + dir_.Path("ckpt-" + host) +
        " --grace 5 -- " + job + " 2>&1");
  }
  std::unique_ptr<testing::Daemon> supervisor_;
};

TEST_F(KcRunHostsTest, EveryRankOnEveryHostGetsItsPartOfTheContract) {
  const std::string job = Script(
      "job.sh",
      "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE group=$GROUP_RANK "
      "master=$MASTER_ADDR id=$TORCHELASTIC_RUN_ID ckpt=$KC_CHECKPOINT_DIR "
      "token=${KC_RENDEZVOUS_TOKEN:-none}\"\n");
  const std::string store = StartSupervisor("a:2,b:1", job);
  auto a = Share("a", store, job);
  auto b = Share("b", store, job);
  EXPECT_EQ(supervisor_->Finish(), 0) << supervisor_->output();
  EXPECT_EQ(a->Finish(), 0) << a->output();
  EXPECT_EQ(b->Finish(), 0) << b->output();
  const std::string out = supervisor_->output();
  for (const std::string& line :
       {"[rank 0] rank=0 world=3 local=0/2 group=0 master=127.0.0.1 id=r7 ckpt=" +
            dir_.Path("ckpt-a") + " token=none",
        "[rank 1] rank=1 world=3 local=1/2 group=0 master=127.0.0.1 id=r7 ckpt=" +
            dir_.Path("ckpt-a") + " token=none",
        "[rank 2] rank=2 world=3 local=0/1 group=1 master=127.0.0.1 id=r7 ckpt=" +
            dir_.Path("ckpt-b") + " token=none"}) {
    EXPECT_THAT(out, HasSubstr(line)) << out;
  }
  EXPECT_THAT(out, HasSubstr("kc run: 3 ranks on 2 hosts (MASTER_ADDR 127.0.0.1, MASTER_PORT "));
  EXPECT_THAT(a->output(), HasSubstr("kc run: --share a: the run is over"));
}

// A rank that fails stops the others on every host; a host that is lost (its share killed,
// its ranks with it) is found within the hosts' timeout and ends the run the same way.
TEST_F(KcRunHostsTest, AFailedRankOrALostHostEndsTheRunOnEveryHost) {
  const std::string job = Script("job.sh",
                                 "echo \"up $RANK\"\n"
                                 "if [ \"$RANK\" = 2 ]; then exit 3; fi\n"
                                 "exec sleep 60\n");
  const std::string store = StartSupervisor("a:2,b:1", job);
  auto a = Share("a", store, job);
  auto b = Share("b", store, job);
  EXPECT_EQ(supervisor_->Finish(), 1) << supervisor_->output();
  EXPECT_THAT(supervisor_->output(),
              HasSubstr("kc run: rank 2 failed (host b): exited with status 3"));
  EXPECT_EQ(a->Finish(), 0) << a->output();  // its ranks stopped, the run over
  EXPECT_EQ(b->Finish(), 0) << b->output();

  const std::string sleeper = Script("sleeper.sh", "echo \"up $RANK\"\nexec sleep 60\n");
  const std::string again = StartSupervisor("a:2,b:1", sleeper);
  a = Share("a", again, sleeper);
  b = Share("b", again, sleeper);
  for (int i = 0; i < 3; ++i) ASSERT_THAT(supervisor_->WaitForLine("] up "), HasSubstr("up "));
  b->Stop(SIGKILL);  // the host's share, and with it its rank
  EXPECT_EQ(supervisor_->Finish(), 1) << supervisor_->output();
  EXPECT_THAT(supervisor_->output(),
              HasSubstr("kc run: rank 2 failed (host b): host b: its share has been "
                        "silent for"));
  EXPECT_EQ(a->Finish(), 0) << a->output();
}

// With --heartbeat-timeout across hosts, each host's share watches its own ranks' files: rank 2
// (host b) stops itself after one beat; its share kills it and the supervisor says why.
TEST_F(KcRunHostsTest, ASilentRankOnAnotherHostIsFoundByItsShare) {
  const std::string job = Script(
      "job.sh",
      "touch \"$KC_HEARTBEAT_FILE\"\n"
      "echo \"up $RANK period=$KC_HEARTBEAT_PERIOD watch=${KC_RUN_HEARTBEAT_TIMEOUT:-hidden}\"\n"
      "if [ \"$RANK\" = 2 ]; then kill -STOP $$; fi\n");
  const std::string store =
      StartSupervisor("a:2,b:1", job, "--heartbeat-timeout 1 --heartbeat-period 0.2");
  auto a = Share("a", store, job);
  auto b = Share("b", store, job);
  EXPECT_EQ(supervisor_->Finish(), 1) << supervisor_->output();
  const std::string out = supervisor_->output();
  EXPECT_THAT(out, HasSubstr("[rank 2] up 2 period=0.2 watch=hidden"));
  EXPECT_THAT(out, HasSubstr("kc run: rank 2 failed (host b): sent no heartbeat for ")) << out;
  EXPECT_THAT(out, HasSubstr("(--heartbeat-timeout 1 s): declared failed and killed"));
  EXPECT_THAT(out, Not(HasSubstr("kc run: rank 0 failed")));  // it ended well: not watched
  EXPECT_EQ(a->Finish(), 0) << a->output();
  EXPECT_EQ(b->Finish(), 0) << b->output();
}

TEST_F(KcRunTest, BadInputIsRefusedNamingIt) {
  testing::KcRun none = Run("--nproc 2");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("command"));
  testing::KcRun missing = Run("--nproc 2 -- no-such-program-here");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("kc run: no-such-program-here: not found on PATH"));
  testing::KcRun zero = Run("--nproc 0 -- true");
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_THAT(zero.err, HasSubstr("--nproc"));
  testing::KcRun above = Run("--nproc 2 --min-nproc 3 -- true");
  EXPECT_EQ(above.exit_code, 2);
  EXPECT_THAT(above.err, HasSubstr("kc run: --min-nproc 3: more than --nproc 2"));
  testing::KcRun beats = Run("--nproc 2 --heartbeat-timeout 1 --heartbeat-period 1 -- true");
  EXPECT_EQ(beats.exit_code, 2);
  EXPECT_THAT(beats.err, HasSubstr("kc run: --heartbeat-timeout 1 with --heartbeat-period 1:"));
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--hosts a:2 -- true", "--hosts needs --listen ADDR[:PORT]"},
           {"--hosts a:2,b --listen 127.0.0.1 -- true", "--hosts: \"b\" is not HOST:RANKS"},
           {"--hosts a:2 --share a --rendezvous 127.0.0.1:1 -- true", "give one or the other"},
           {"--share a -- true", "--share needs --rendezvous ADDR:PORT"},
           {"--hosts a:2 --listen 127.0.0.1 --nproc 2 -- true", "--nproc: across hosts"},
           {"--hosts a:2 --listen 127.0.0.1 --max-restarts 1 -- true",
            "--max-restarts: not across hosts yet"},
           {"--nproc 2 --rendezvous 127.0.0.1:1 -- true", "--rendezvous and --listen are for"}}) {
    testing::KcRun r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(want)) << args;
  }
}

}  // namespace
}  // namespace kc
