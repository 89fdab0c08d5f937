// `kc diagnose` on real runs of `kc train` with a fault made on purpose: each drill's verdict
// names the layer at fault (the seed's lane misconfiguration at L2, a pipeline with too few
// micro-batches at L3, a rank killed at L4), and a healthy run has no fault.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child_guard.h"
#include "tests/support/daemon.h"
#include "tests/support/inventories.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc {
namespace {

using ::testing::HasSubstr;

class KcDiagnoseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new testing::TempDir("kc_diagnose_data");
    testing::KcRun r = testing::PrepareMicroData(KC_BINARY, *data_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  // kc train of `model` with `flags` into OUT = this test's directory / name.
  testing::KcRun Train(const std::string& model, const std::string& name,
                       const std::string& flags) {
    return testing::RunKc(
        KC_BINARY, "train " + model + " --data " + data_->Path("fortunes/manifest.json") +
                       " --progress none --eval-every 0 --out " + dir_.Path(name) + " " + flags);
  }
  // kc diagnose --json of run `name`: its findings.
  nlohmann::json Findings(const std::string& name) {
    testing::KcRun d = testing::RunKc(KC_BINARY, "diagnose --json " + dir_.Path(name));
    EXPECT_EQ(d.exit_code, 0) << d.err;
    const nlohmann::json j = nlohmann::json::parse(d.out, nullptr, false);
    return j.is_object() ? j["findings"] : nlohmann::json::array();
  }
  static bool Has(const nlohmann::json& findings, const std::string& layer,
                  const std::string& what) {
    for (const nlohmann::json& f : findings) {
      if (f["layer"] == layer && f["kind"] == "fault" &&
          f["what"].get<std::string>().find(what) != std::string::npos) {
        return true;
      }
    }
    return false;
  }

  static testing::TempDir* data_;
  testing::TempDir dir_{"kc_diagnose"};
  const std::string micro_ = dir_.Write("micro.yaml", testing::kMicroModel);
};

testing::TempDir* KcDiagnoseTest::data_ = nullptr;

// The cores this process may run on (kc train's ranks go to them in order).
std::vector<int> UsableCpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  return cpus;
}

// A child spinning on `cpu` for ever, at `nice` (negative: ahead of the ranks).
pid_t Hog(int cpu, int nice) {
  const pid_t hog = fork();
  if (hog != 0) return hog;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  sched_setaffinity(0, sizeof one, &one);
  if (nice != 0) setpriority(PRIO_PROCESS, 0, nice);
  for (volatile uint64_t spin = 0;; spin = spin + 1) {
  }
}

// (12 steps: too few for the drift check, whose verdict on a machine shared with other tests
// would be the machine's, not the run's.)
TEST_F(KcDiagnoseTest, AHealthyRunHasNoFault) {
  ASSERT_EQ(Train(micro_, "healthy", "--steps 12").exit_code, 0);
  const nlohmann::json f = Findings("healthy");
  for (const nlohmann::json& x : f) EXPECT_NE(x["kind"], "fault") << x.dump();
  testing::KcRun text = testing::RunKc(KC_BINARY, "diagnose " + dir_.Path("healthy"));
  EXPECT_THAT(text.out, HasSubstr("kc diagnose"));
}

// The seed's incident: lanes reordered so that gradients are not first.
TEST_F(KcDiagnoseTest, TheGradientLaneNotFirstIsAnL2Fault) {
  const std::string limits =
      dir_.Write("limits.yaml", "lanes:\n  priority: [activation, gradient, control, telemetry]\n");
  ASSERT_EQ(Train(micro_, "lanes", "--steps 10 --ranks 2 --comm-limits " + limits).exit_code, 0);
  const nlohmann::json f = Findings("lanes");
  EXPECT_TRUE(Has(f, "L2", "the gradient lane is not first")) << f.dump(2);
  EXPECT_EQ(f[0]["layer"], "L2") << f.dump(2);  // the first fault, bottom-up
}

// A rate limit far below what the job sends: its collectives wait for the token buckets.
TEST_F(KcDiagnoseTest, ATightRateLimitIsAnL2Fault) {
  const std::string limits =
      dir_.Write("tight.yaml", "rate_limits:\n  default: {ops_per_second: 20, burst_ops: 1}\n");
  ASSERT_EQ(Train(micro_, "tight", "--steps 8 --ranks 2 --comm-limits " + limits).exit_code, 0);
  const nlohmann::json f = Findings("tight");
  EXPECT_TRUE(Has(f, "L2", "the job's comm limits hold its collectives back")) << f.dump(2);
}

TEST_F(KcDiagnoseTest, APipelineWithTooFewMicroBatchesIsAnL3Bubble) {
  const std::string model = dir_.Write(
      "two.yaml",
      "name: two\nlayers: 2\nhidden: 64\nheads: 2\nvocab: 257\nseq_len: 32\nbatch_per_rank: 4\n");
  ASSERT_EQ(Train(model, "bubble", "--steps 10 --plan \"p=2 micro_batches=2\"").exit_code, 0);
  EXPECT_TRUE(Has(Findings("bubble"), "L3", "bubble")) << Findings("bubble").dump(2);
}

TEST_F(KcDiagnoseTest, ARankKilledIsAnL4Fault) {
  EXPECT_NE(Train(micro_, "killed", "--steps 20 --ranks 2 --inject-fault 1:5:kill").exit_code, 0);
  const nlohmann::json f = Findings("killed");
  EXPECT_TRUE(Has(f, "L4", "1 rank failed")) << f.dump(2);
  EXPECT_TRUE(Has(f, "L4", "the run did not finish")) << f.dump(2);
}

// A rank that shares its core with a busy process of higher priority: L1 names it as the
// straggler, from the ranks' compute times the supervisor records ("ranks" records).
TEST_F(KcDiagnoseTest, ARankThrottledByAnotherProcessIsAnL1Straggler) {
  const std::vector<int> cpus = UsableCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two cores: one rank each";
  // kc train pins rank r to the r-th usable core with one thread per rank (they fit); the
  // hog takes rank 1's, ahead of it.
  const pid_t hog = Hog(cpus[1], -10);
  ASSERT_GE(hog, 0);
  testing::ChildGuard hog_guard(hog);
  const std::string out = dir_.Path("throttled");
  testing::Daemon train(
      fmt::format("{} train {} --data {} --progress none --eval-every 0 --out {} --ranks 2 "
                  "--threads-per-rank 1 --steps 10000000",
                  KC_BINARY, micro_, data_->Path("fortunes/manifest.json"), out));
  // A report of the ranks' compute times (one every ten seconds), then it is stopped.
  int reports = 0;
  for (int i = 0; i < 1200 && reports < 1; ++i) {
    std::ifstream metrics(out + "/metrics.jsonl");
    reports = 0;
    for (std::string line; std::getline(metrics, line);) {
      reports += line.find("\"type\":\"ranks\"") != std::string::npos;
    }
    if (reports < 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(reports, 1) << "no ranks record in " << out;
  train.Stop(SIGTERM);
  hog_guard.KillAndReap();
  const nlohmann::json f = Findings("throttled");
  EXPECT_TRUE(Has(f, "L1", "rank 1 is a straggler")) << f.dump(2);
}

// kc diagnose --live on a running run whose rank 1 stopped (SIGSTOP) before a step, with a
// heartbeat timeout long enough that nothing declares it failed: the supervisor's answer names
// it as the rank the other waits for, with each rank's newest operations. (What rank 1 did last
// is what its last heartbeat said: stopped within its first beats, that may be nothing yet.)
TEST_F(KcDiagnoseTest, LiveNamesTheStoppedRankTheOthersWaitFor) {
  const std::string out = dir_.Path("stopped");
  testing::Daemon train(fmt::format(
      "{} train {} --data {} --progress none --eval-every 0 --out {} --ranks 2 --steps 10000000 "
      "--heartbeat-period 0.2 --heartbeat-timeout 600 --inject-fault 1:5:stop",
      KC_BINARY, micro_, data_->Path("fortunes/manifest.json"), out));
  // Until an answer says so: the first ones may come before the heartbeats published the wait.
  nlohmann::json live;
  for (int i = 0; i < 60; ++i) {
    testing::KcRun d = testing::RunKc(KC_BINARY, "diagnose --json --live --wait 10 " + out);
    if (d.exit_code != 0) {
      // Not started yet: no metrics file, or not its header yet.
      EXPECT_THAT(d.err,
                  ::testing::AnyOf(HasSubstr("no metrics.jsonl"), HasSubstr("no run record")))
          << d.err;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(d.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << d.out;
    live = j.value("live", nlohmann::json());
    if (live.value("hang", std::string()).find("worker 1 has not entered") != std::string::npos) {
      EXPECT_TRUE(Has(j["findings"], "L2", "a hang")) << j.dump(2);
      break;
    }
  }
  train.Stop(SIGKILL);
  ASSERT_TRUE(live.is_object());
  EXPECT_THAT(live.value("hang", std::string()),
              ::testing::ContainsRegex("allreduce #[0-9]+ of .*: worker 1 has not entered it "
                                       "\\(last: [^)]+\\); worker 0 waits in it"));
  ASSERT_EQ(live["ranks"].size(), 2u) << live.dump(2);
  const nlohmann::json& zero = live["ranks"][0];
  EXPECT_EQ(zero["worker"], 0);
  ASSERT_FALSE(zero["groups"].empty());
  const nlohmann::json& ops = zero["groups"][0]["ops"];
  ASSERT_GE(ops.size(), 2u);
  EXPECT_EQ(ops.back()["took_s"], -1);  // the one it waits in
  EXPECT_GE(ops[ops.size() - 2]["took_s"].get<double>(), 0);
}

// kc diagnose --live measures the run's host now: a busy process on rank 1's core is named
// as other work on the run's cores (L4), with its pid, and each core's rate is there with the
// rate it had as the run started.
TEST_F(KcDiagnoseTest, LiveNamesAnotherProcessOnTheRunsCores) {
  const std::vector<int> cpus = UsableCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two cores: one rank each";
  const std::string out = dir_.Path("shared");
  testing::Daemon train(
      fmt::format("{} train {} --data {} --progress none --eval-every 0 --out {} --ranks 2 "
                  "--threads-per-rank 1 --steps 10000000",
                  KC_BINARY, micro_, data_->Path("fortunes/manifest.json"), out));
  const pid_t hog = Hog(cpus[1], 0);
  ASSERT_GE(hog, 0);
  testing::ChildGuard hog_guard(hog);
  nlohmann::json j;
  for (int i = 0; i < 100; ++i) {
    testing::KcRun d = testing::RunKc(KC_BINARY, "diagnose --json --live --wait 10 " + out);
    if (d.exit_code == 0) {
      j = nlohmann::json::parse(d.out, nullptr, false);
      break;
    }
    // Not started yet: no metrics file, or not its header yet.
    EXPECT_THAT(d.err, ::testing::AnyOf(HasSubstr("no metrics.jsonl"), HasSubstr("no run record")))
        << d.err;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  train.Stop(SIGKILL);
  hog_guard.KillAndReap();
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(Has(j["findings"], "L4", "other work on the run's cores")) << j.dump(2);
  const nlohmann::json& hosts = j["live"]["hosts"];
  ASSERT_EQ(hosts.size(), 1u) << j.dump(2);
  ASSERT_FALSE(hosts[0]["others"].empty()) << j.dump(2);
  EXPECT_EQ(hosts[0]["others"][0]["pid"], hog) << j.dump(2);
  ASSERT_EQ(hosts[0]["cores"].size(), 2u) << j.dump(2);  // the ranks', pinned one a core
  for (const nlohmann::json& core : hosts[0]["cores"]) EXPECT_GT(core["sgemm_flops"], 1e8);
}

// A run that has ended has nothing live to ask.
TEST_F(KcDiagnoseTest, LiveOnARunThatEndedSaysSo) {
  ASSERT_EQ(Train(micro_, "ended", "--steps 3").exit_code, 0);
  testing::KcRun d = testing::RunKc(KC_BINARY, "diagnose --live " + dir_.Path("ended"));
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_THAT(d.err, HasSubstr("the run has ended"));
}

TEST_F(KcDiagnoseTest, ADirectoryWithoutARunIsRefused) {
  testing::KcRun d = testing::RunKc(KC_BINARY, "diagnose " + dir_.Path("nothing"));
  EXPECT_EQ(d.exit_code, 2);
  EXPECT_THAT(d.err, HasSubstr("no metrics.jsonl"));
}

}  // namespace
}  // namespace kc
