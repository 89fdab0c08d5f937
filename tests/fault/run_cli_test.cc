// `kc run` as a user runs it: any program as N ranks with torchrun's launch environment, each
// rank's output prefixed, a failed rank stopping the others and restarting the group by policy,
// SIGTERM stopping every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <string>

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
}

}  // namespace
}  // namespace kc
