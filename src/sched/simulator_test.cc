#include "sched/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hal/inventory.h"
#include "sched/trace_gen.h"
#include "tests/support/repo_root.h"

namespace kc::sched {
namespace {

using ::testing::HasSubstr;

// One trace row of team "t", user "u".
TraceJob Row(double submit_s, std::string job, std::string job_class, int min_devices,
             int max_devices, double duration_s) {
  return {.submit_s = submit_s,
          .job = std::move(job),
          .team = "t",
          .user = "u",
          .job_class = std::move(job_class),
          .min_devices = min_devices,
          .max_devices = max_devices,
          .duration_s = duration_s};
}

// The hand-written traces in examples/traces/, one per feature, on a 32-device cluster.
class SimulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<hal::TopologySpec> spec =
        hal::LoadInventory(testing::RepoRoot() + "examples/clusters/dgx-a100x4.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    Result<hal::Topology> t = hal::Topology::Build(std::move(*spec));
    ASSERT_TRUE(t.ok()) << t.status().message();
    topo_ = std::make_unique<hal::Topology>(std::move(*t));
    Result<PoolConfig> one = LoadPoolConfig(testing::RepoRoot() + "examples/traces/one-pool.yaml");
    ASSERT_TRUE(one.ok()) << one.status().message();
    one_pool_ = *one;
  }

  // Runs examples/traces/NAME.csv; decisions_ collects what the scheduler decided.
  SimReport Run(const std::string& name, const PoolConfig& pools,
                Policy policy = Policy::kKuangchao,
                CheckpointPolicy ckpt = CheckpointPolicy::kAdvised) {
    Result<std::vector<TraceJob>> trace =
        LoadTrace(testing::RepoRoot() + "examples/traces/" + name + ".csv");
    KC_CHECK(trace.ok()) << trace.status().message();
    decisions_.clear();
    Result<SimReport> r =
        Simulate(*topo_, pools, *trace, {.scheduler = {.policy = policy, .checkpoint = ckpt}},
                 [this](const Decision& d) { decisions_.push_back(d); });
    KC_CHECK(r.ok()) << r.status().message();
    return *r;
  }
  // Runs `trace`; decisions_ collects what the scheduler decided.
  SimReport RunJobs(const std::vector<TraceJob>& trace, const PoolConfig& pools,
                    Policy policy = Policy::kKuangchao) {
    decisions_.clear();
    Result<SimReport> r = Simulate(*topo_, pools, trace, {.scheduler = {.policy = policy}},
                                   [this](const Decision& d) { decisions_.push_back(d); });
    KC_CHECK(r.ok()) << r.status().message();
    return *r;
  }
  // The first decision of `kind` for `job`, or null.
  const Decision* First(DecisionKind kind, const std::string& job) const {
    for (const Decision& d : decisions_) {
      if (d.kind == kind && d.job == job) return &d;
    }
    return nullptr;
  }

  std::unique_ptr<hal::Topology> topo_;
  PoolConfig one_pool_;
  std::vector<Decision> decisions_;
};

TEST_F(SimulatorTest, BackfillRunsShortJobsWithoutDelayingTheHead) {
  SimReport fifo = Run("backfill", one_pool_, Policy::kFifo);
  const double fifo_head = First(DecisionKind::kStart, "head")->time_s;
  const double fifo_short = First(DecisionKind::kStart, "short")->time_s;
  EXPECT_GT(fifo_short, fifo_head);  // FIFO: behind the head
  // The seed rule's checkpoints, as FIFO's: "wide" then ends at the same time in both.
  SimReport kc = Run("backfill", one_pool_, Policy::kKuangchao, CheckpointPolicy::kSeedRule);
  EXPECT_EQ(First(DecisionKind::kStart, "short")->time_s, 20);
  EXPECT_THAT(First(DecisionKind::kStart, "short")->reason, HasSubstr("backfilled"));
  EXPECT_EQ(First(DecisionKind::kStart, "head")->time_s, fifo_head);  // not delayed
  EXPECT_GT(First(DecisionKind::kStart, "long")->time_s, fifo_head);
  EXPECT_GT(kc.utilisation_arrivals, fifo.utilisation_arrivals);
  EXPECT_EQ(kc.finished, 4);
  EXPECT_EQ(fifo.finished, 4);
}

TEST_F(SimulatorTest, CompletionTimeRunsFromSubmitToEndPerClassAndOverAll) {
  Result<std::vector<TraceJob>> trace =
      LoadTrace(testing::RepoRoot() + "examples/traces/preemption.csv");
  ASSERT_TRUE(trace.ok()) << trace.status();
  for (Policy policy : {Policy::kKuangchao, Policy::kFifo}) {
    SimReport r = Run("preemption", DefaultPoolConfig(), policy);
    int jobs = 0;
    for (const auto& [cls, c] : r.completion) {
      if (cls == "all") continue;
      jobs += c.jobs;
      // At least its wait and its run time; p95 between the median and the longest.
      double run = 0;
      int n = 0;
      for (const TraceJob& j : *trace) {
        if (j.job_class == cls) run += j.duration_s, ++n;
      }
      EXPECT_EQ(c.jobs, n) << cls;
      EXPECT_GE(c.mean_s + 1e-6, r.delay.at(cls).mean_s + run / n) << cls;
      EXPECT_LE(c.p50_s, c.p95_s) << cls;
      EXPECT_LE(c.p95_s, c.max_s) << cls;
    }
    EXPECT_EQ(jobs, r.finished);
    EXPECT_EQ(r.completion.at("all").jobs, r.finished);
  }
}

TEST_F(SimulatorTest, HighPriorityJobsPreemptAndVictimsResume) {
  SimReport r = Run("preemption", DefaultPoolConfig());
  EXPECT_EQ(r.finished, 6);
  EXPECT_EQ(r.preemptions, 2);
  EXPECT_LE(r.delay.at("high").max_s, 60);
  EXPECT_LE(r.delay.at("normal").max_s, 60);
  ASSERT_NE(First(DecisionKind::kPreempt, "p3"), nullptr);
  const Decision* resumed = nullptr;
  for (const Decision& d : decisions_) {
    if (d.kind == DecisionKind::kStart && d.job == "p3" && d.resume) resumed = &d;
  }
  ASSERT_NE(resumed, nullptr);
  EXPECT_GT(r.lost_preemption_h, 0);
  // FIFO has no preemption: the high job waits for a preemptible job to end.
  SimReport fifo = Run("preemption", DefaultPoolConfig(), Policy::kFifo);
  EXPECT_EQ(fifo.preemptions, 0);
  EXPECT_GT(fifo.delay.at("high").max_s, 3600);
}

TEST_F(SimulatorTest, LentDevicesComeBackToTheirPool) {
  SimReport r = Run("lending", DefaultPoolConfig());
  const Decision* n2 = First(DecisionKind::kStart, "n2");
  ASSERT_NE(n2, nullptr);
  EXPECT_TRUE(n2->borrowed);
  EXPECT_EQ(n2->pool, "high");
  ASSERT_NE(First(DecisionKind::kPreempt, "n2"), nullptr);
  EXPECT_EQ(First(DecisionKind::kStart, "h1")->after, std::vector<std::string>{"n2"});
  EXPECT_LE(r.delay.at("high").max_s, 60);
  EXPECT_EQ(r.finished, 4);
}

TEST_F(SimulatorTest, ElasticJobsShrinkForHighPriorityAndGrowBack) {
  SimReport r = Run("elastic", one_pool_);
  EXPECT_EQ(r.preemptions, 0);
  EXPECT_EQ(r.shrinks, 1);
  EXPECT_EQ(r.grows, 1);
  EXPECT_EQ(First(DecisionKind::kShrink, "e1")->devices.size(), 24u);
  EXPECT_EQ(First(DecisionKind::kGrow, "e1")->devices.size(), 32u);
  EXPECT_LE(r.delay.at("high").max_s, 10);
}

TEST_F(SimulatorTest, FaultyJobsAreDemotedAndTheAdviceFollowsTheirFaults) {
  SimReport advised = Run("demotion", one_pool_);
  ASSERT_NE(First(DecisionKind::kDemote, "buggy"), nullptr);
  EXPECT_GE(advised.demotions, 1);
  EXPECT_EQ(advised.finished, 2);
  // With the seed rule's fixed 30-minute interval, a job failing every two minutes never
  // gets past its first checkpoint: the run stops at its time limit.
  SimReport seed = Run("demotion", one_pool_, Policy::kKuangchao, CheckpointPolicy::kSeedRule);
  EXPECT_TRUE(seed.hit_time_limit);
  EXPECT_EQ(seed.finished, 1);
  ASSERT_EQ(seed.unfinished.size(), 1u);
  EXPECT_THAT(seed.unfinished[0], HasSubstr("buggy"));
}

TEST_F(SimulatorTest, FairShareRunsTheOtherTeamSecond) {
  Run("fairshare", one_pool_);
  EXPECT_LT(First(DecisionKind::kStart, "b1")->time_s, First(DecisionKind::kStart, "a2")->time_s);
  Run("fairshare", one_pool_, Policy::kFifo);
  EXPECT_GT(First(DecisionKind::kStart, "b1")->time_s, First(DecisionKind::kStart, "a4")->time_s);
}

TEST_F(SimulatorTest, WorkIsConservedAndRunsAreDeterministic) {
  Result<std::vector<TraceJob>> trace = GenerateSyntheticTrace(
      {.jobs = 300, .devices = 32, .devices_per_host = 8, .load = 1.5, .seed = 7});
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  double work = 0;
  for (const TraceJob& j : *trace) work += j.duration_s * j.max_devices;
  for (Policy policy : {Policy::kKuangchao, Policy::kFifo}) {
    Result<SimReport> a =
        Simulate(*topo_, DefaultPoolConfig(), *trace, {.scheduler = {.policy = policy}});
    Result<SimReport> b =
        Simulate(*topo_, DefaultPoolConfig(), *trace, {.scheduler = {.policy = policy}});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->finished + static_cast<int>(a->unfinished.size()), 300);
    if (a->unfinished.empty()) {
      // Every job's work was done once: useful device time is the trace's work.
      EXPECT_NEAR(a->useful_utilisation * topo_->num_devices() * a->makespan_s, work, 1e-6 * work);
    }
    // Devices held never exceed the cluster, and cover at least the useful work.
    for (auto [t, u] : a->curve) EXPECT_LE(u, 1 + 1e-9) << "at " << t;
    EXPECT_GE(a->utilisation + 1e-9, a->useful_utilisation);
    EXPECT_EQ(a->makespan_s, b->makespan_s);
    EXPECT_EQ(a->preemptions, b->preemptions);
    EXPECT_EQ(a->faults, b->faults);
    EXPECT_EQ(a->lost_preemption_h, b->lost_preemption_h);
  }
}

// A stream of normal jobs keeps the cluster full for 12 hours; a preemptible job of the
// whole cluster, outranked by every one of them, would wait until the stream ends. Pending
// starve_after_h, it is promoted to the normal level, first within it: its reservation
// holds the devices as the running jobs end.
TEST_F(SimulatorTest, StarvingJobsArePromotedAndReserved) {
  std::vector<TraceJob> trace;
  for (int k = 0; k < 24; ++k) {
    trace.push_back({.submit_s = 1800.0 * k,
                     .job = "n" + std::to_string(k),
                     .team = "t",
                     .user = "u" + std::to_string(k % 3),
                     .job_class = "normal",
                     .min_devices = 8,
                     .max_devices = 8,
                     .duration_s = 7200});
  }
  trace.push_back({.submit_s = 60,
                   .job = "big",
                   .team = "t2",
                   .user = "v",
                   .job_class = "preemptible",
                   .min_devices = 32,
                   .max_devices = 32,
                   .duration_s = 3600});
  PoolConfig pools = one_pool_;
  pools.settings.starve_after_s = 0;  // never
  RunJobs(trace, pools);
  EXPECT_EQ(First(DecisionKind::kPromote, "big"), nullptr);
  EXPECT_GE(First(DecisionKind::kStart, "big")->time_s, 23 * 1800);
  pools.settings.starve_after_s = 3600;
  SimReport r = RunJobs(trace, pools);
  const Decision* promoted = First(DecisionKind::kPromote, "big");
  ASSERT_NE(promoted, nullptr);
  EXPECT_GE(promoted->time_s, 3660);
  // Once the jobs running then end (their checkpoints add a little to their 2 hours).
  EXPECT_LE(First(DecisionKind::kStart, "big")->time_s, promoted->time_s + 1.1 * 7200);
  EXPECT_EQ(r.promotions, 1);
  EXPECT_EQ(r.finished, 25);
}

// Default pools on 32 devices: high 4, preemptible 8, normal 20. A high-priority gang of 16
// devices is larger than what it may take at once (its pool and the preemptible jobs): it
// needs devices that normal jobs hold for hours. Past high_max_wait_s it preempts them
// too; without that, its reservation holds the devices until they end.
TEST_F(SimulatorTest, OverdueHighPriorityGangsPreemptNormalJobs) {
  const std::vector<TraceJob> trace = {
      Row(0, "n1", "normal", 16, 16, 36000), Row(0, "n2", "normal", 4, 4, 7200),
      Row(0, "p1", "preemptible", 8, 8, 36000), Row(600, "gang", "high", 16, 16, 3600),
      Row(1200, "n3", "normal", 4, 4, 72000)};
  PoolConfig pools = DefaultPoolConfig();
  pools.settings.high_max_wait_s = 0;
  RunJobs(trace, pools);
  const double reserved = First(DecisionKind::kStart, "gang")->time_s;
  EXPECT_GE(reserved, 7200);                                       // when n2 ends
  EXPECT_GT(First(DecisionKind::kStart, "n3")->time_s, reserved);  // not on its devices
  EXPECT_EQ(First(DecisionKind::kPreempt, "n1"), nullptr);
  EXPECT_EQ(First(DecisionKind::kPreempt, "n2"), nullptr);
  pools.settings.high_max_wait_s = 1800;
  SimReport r = RunJobs(trace, pools);
  EXPECT_LE(First(DecisionKind::kStart, "gang")->time_s, 600 + 60);  // the grace period
  EXPECT_TRUE(First(DecisionKind::kPreempt, "n1") != nullptr ||
              First(DecisionKind::kPreempt, "n2") != nullptr);
  EXPECT_EQ(r.finished, 5);
}

// Default pools on 32 devices: high 4, preemptible 8, normal 20. An elastic normal job of up
// to 32 devices starts on its pool's 20 and grows onto the idle devices the other pools lend
// (preemptibly); a high-priority job takes its pool's devices back by shrinking it, not
// pausing it.
TEST_F(SimulatorTest, ElasticJobsGrowOntoLentDevicesAndGiveThemBack) {
  const std::vector<TraceJob> trace = {Row(0, "elastic", "normal", 8, 32, 36000),
                                       Row(60, "tick", "normal", 1, 1, 60),
                                       Row(3600, "urgent", "high", 4, 4, 600)};
  SimReport r = RunJobs(trace, DefaultPoolConfig());
  ASSERT_NE(First(DecisionKind::kStart, "elastic"), nullptr);
  EXPECT_EQ(First(DecisionKind::kStart, "elastic")->devices.size(), 20u);
  const Decision* grown = First(DecisionKind::kGrow, "elastic");
  ASSERT_NE(grown, nullptr);
  EXPECT_GT(grown->devices.size(), 20u);
  EXPECT_TRUE(grown->borrowed);
  EXPECT_NE(First(DecisionKind::kShrink, "elastic"), nullptr);
  EXPECT_EQ(First(DecisionKind::kPreempt, "elastic"), nullptr);
  EXPECT_LE(First(DecisionKind::kStart, "urgent")->time_s, 3600 + 60);
  EXPECT_EQ(r.finished, 3);
}

// A job started on a kind of placement with no history gets the prior's short interval
// (borrowed devices: about 7 minutes for a 60 s checkpoint); as that kind runs without
// interruption, the advice lengthens and the running job follows it (looked at in the
// passes that short jobs arriving every hour cause).
TEST_F(SimulatorTest, RunningJobsFollowTheAdviceAsHistoryGrows) {
  std::vector<TraceJob> trace = {{.submit_s = 0,
                                  .job = "long",
                                  .team = "t",
                                  .user = "u",
                                  .job_class = "preemptible",
                                  .min_devices = 8,
                                  .max_devices = 8,
                                  .duration_s = 48 * 3600.0}};
  for (int h = 1; h < 48; ++h) {
    trace.push_back({.submit_s = 3600.0 * h,
                     .job = "tick" + std::to_string(h),
                     .team = "t",
                     .user = "u",
                     .job_class = "normal",
                     .min_devices = 1,
                     .max_devices = 1,
                     .duration_s = 60});
  }
  SimReport r = RunJobs(trace, one_pool_);
  double first = 0, last = 0;
  for (const Decision& d : decisions_) {
    if (d.job != "long") continue;
    if (d.kind == DecisionKind::kStart) first = d.checkpoint_interval_s;
    if (d.kind == DecisionKind::kInterval) last = d.checkpoint_interval_s;
  }
  EXPECT_LT(first, 600);
  EXPECT_GT(last, 3 * first);
  EXPECT_EQ(r.finished, 48);
}

TEST_F(SimulatorTest, RefusedJobsAreReportedNotFatal) {
  std::vector<TraceJob> trace = {{.submit_s = 0,
                                  .job = "huge",
                                  .team = "t",
                                  .user = "u",
                                  .job_class = "normal",
                                  .min_devices = 64,
                                  .max_devices = 64,
                                  .duration_s = 10},
                                 {.submit_s = 1,
                                  .job = "ok",
                                  .team = "t",
                                  .user = "u",
                                  .job_class = "normal",
                                  .min_devices = 1,
                                  .max_devices = 1,
                                  .duration_s = 10}};
  Result<SimReport> r = Simulate(*topo_, DefaultPoolConfig(), trace, {});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->refused.size(), 1u);
  EXPECT_THAT(r->refused[0], HasSubstr("job huge: refused: asks for at least 64 devices"));
  EXPECT_EQ(r->finished, 1);
  PoolConfig bad;
  bad.pools.push_back({.name = "x", .classes = {JobClass::kNormal}, .devices = 99});
  EXPECT_THAT(Simulate(*topo_, bad, trace, {}).status().message(),
              HasSubstr("pool \"x\": asks for 99 devices"));
}

}  // namespace
}  // namespace kc::sched
