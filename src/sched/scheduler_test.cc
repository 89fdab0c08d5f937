#include "sched/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "hal/inventory.h"

namespace kc::sched {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Four hosts of four devices in two racks: a0 (devices 0-3), a1 (4-7) in r0; b0 (8-11),
// b1 (12-15) in r1.
constexpr char kCluster[] = R"(
name: test16
models:
  M: {kind: simulated, memory_gb: 80, peak_tflops_fp32: 10, peak_tflops_bf16: 100,
      memory_bandwidth_gbs: 1000}
hosts:
  - {name: "a[0-1]", rack: r0, model: M, count: 4,
     intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2},
     network: {bandwidth_gbs: 25, latency_us: 5}}
  - {name: "b[0-1]", rack: r1, model: M, count: 4,
     intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2},
     network: {bandwidth_gbs: 25, latency_us: 5}}
)";

hal::Topology Cluster() {
  Result<hal::TopologySpec> spec = hal::LoadInventoryString(kCluster, "test16.yaml");
  KC_CHECK(spec.ok()) << spec.status().message();
  Result<hal::Topology> t = hal::Topology::Build(std::move(*spec));
  KC_CHECK(t.ok()) << t.status().message();
  return std::move(*t);
}

PoolConfig OnePool() { return AllDevicesPoolConfig(); }

// high: a0; preemptible: a1; normal: b0 and b1.
PoolConfig ThreePools() {
  PoolConfig c;
  c.pools.push_back({.name = "high", .classes = {JobClass::kHigh}, .hosts = "a0"});
  c.pools.push_back({.name = "preemptible", .classes = {JobClass::kPreemptible}, .hosts = "a1"});
  c.pools.push_back({.name = "normal", .classes = {JobClass::kNormal}, .rest = true});
  return c;
}

JobRequest Job(std::string id, int min, int max, double duration_s = 1000,
               JobClass c = JobClass::kNormal, std::string team = "t", std::string user = "u") {
  return {.id = std::move(id),
          .team = std::move(team),
          .user = std::move(user),
          .job_class = c,
          .min_devices = min,
          .max_devices = max,
          .tp = 1,
          .kind = "",
          .pool = "",
          .duration_s = duration_s,
          .checkpoint_cost_s = 60};
}

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(const PoolConfig& config, Policy policy = Policy::kKuangchao) {
    Result<std::unique_ptr<Scheduler>> s = Scheduler::Create(
        &topo_, config, {.policy = policy, .checkpoint = CheckpointPolicy::kAdvised});
    ASSERT_TRUE(s.ok()) << s.status().message();
    sched_ = std::move(*s);
  }
  void Submit(const JobRequest& r, double t) {
    Status s = sched_->Submit(r, t);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  // The pass at t; remembers every decision by job.
  std::vector<Decision> Pass(double t) {
    std::vector<Decision> d = sched_->Schedule(t);
    for (const Decision& x : d) last_[x.job] = x;
    return d;
  }
  JobStatus Query(const std::string& job) {
    Result<JobStatus> s = sched_->Query(job);
    KC_CHECK(s.ok()) << s.status().message();
    return *s;
  }
  std::set<int> Hosts(const std::vector<int>& devices) {
    std::set<int> h;
    for (int d : devices) h.insert(topo_.host_of(d));
    return h;
  }
  std::set<std::string> Racks(const std::vector<int>& devices) {
    std::set<std::string> r;
    for (int d : devices) r.insert(topo_.device(d).rack);
    return r;
  }
  static const Decision* Find(const std::vector<Decision>& ds, DecisionKind kind,
                              const std::string& job) {
    for (const Decision& d : ds) {
      if (d.kind == kind && d.job == job) return &d;
    }
    return nullptr;
  }

  hal::Topology topo_ = Cluster();
  std::unique_ptr<Scheduler> sched_;
  std::map<std::string, Decision> last_;
};

TEST_F(SchedulerTest, PlacementFillsAHostThenARackBeforeSpanning) {
  Make(OnePool());
  Submit(Job("a", 3, 3), 0);
  Pass(0);
  ASSERT_EQ(Query("a").devices.size(), 3u);
  EXPECT_EQ(Hosts(Query("a").devices).size(), 1u);
  const int host_a = *Hosts(Query("a").devices).begin();
  // Best fit: the one device left on a's host, not a fresh host.
  Submit(Job("b", 1, 1), 1);
  Pass(1);
  EXPECT_EQ(Hosts(Query("b").devices), std::set<int>{host_a});
  // Eight devices: one whole rack (the other rack has only one free host).
  Submit(Job("c", 8, 8), 2);
  Pass(2);
  EXPECT_EQ(Query("c").devices.size(), 8u);
  EXPECT_EQ(Racks(Query("c").devices).size(), 1u);
  EXPECT_EQ(Hosts(Query("c").devices).size(), 2u);
  // Gang: five devices do not fit in the four left; nothing starts, and the reason says so.
  Submit(Job("d", 5, 5), 3);
  EXPECT_TRUE(Pass(3).empty());
  EXPECT_EQ(Query("d").state, JobState::kPending);
  EXPECT_THAT(Query("d").reason, StartsWith("pending: reason=Resources"));
  EXPECT_TRUE(Query("d").devices.empty());
}

TEST_F(SchedulerTest, TensorParallelGroupsStayInsideHosts) {
  Make(OnePool());
  // Leave 1, 3, 2 and 2 devices free on the four hosts.
  Submit(Job("x0", 3, 3), 0);
  Submit(Job("x1", 1, 1), 0);
  Submit(Job("x2", 2, 2), 0);
  Submit(Job("x3", 2, 2), 0);
  Pass(0);
  JobRequest tp = Job("tp", 6, 6);
  tp.tp = 2;
  Submit(tp, 1);
  Pass(1);
  std::vector<int> devs = Query("tp").devices;
  ASSERT_EQ(devs.size(), 6u);
  std::map<int, int> per_host;
  for (int d : devs) ++per_host[topo_.host_of(d)];
  for (auto [h, n] : per_host) EXPECT_EQ(n % 2, 0) << "host " << h << " holds " << n;
}

TEST_F(SchedulerTest, BackfillNeverDelaysTheHeadJobsReservation) {
  Make(OnePool());
  Submit(Job("r", 12, 12, 100), 0);  // ends at 100
  Pass(0);
  Submit(Job("head", 16, 16, 100), 1);  // needs everything: reserved for t = 100
  Submit(Job("long", 4, 4, 1000), 2);   // would hold devices past 100
  Submit(Job("short", 4, 4, 50), 3);    // ends at 53
  std::vector<Decision> d = Pass(3);
  EXPECT_EQ(Find(d, DecisionKind::kStart, "long"), nullptr);
  const Decision* s = Find(d, DecisionKind::kStart, "short");
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->reason, HasSubstr("backfilled: ends before head's reservation"));
  EXPECT_THAT(Query("long").reason, HasSubstr("reason=Reservation"));
  EXPECT_THAT(Query("long").reason, HasSubstr("held for job head"));
  ASSERT_TRUE(sched_->Finished("short", 53).ok());
  EXPECT_EQ(Find(Pass(53), DecisionKind::kStart, "long"), nullptr);
  ASSERT_TRUE(sched_->Finished("r", 100).ok());
  d = Pass(100);
  ASSERT_NE(Find(d, DecisionKind::kStart, "head"), nullptr);
  EXPECT_EQ(Find(d, DecisionKind::kStart, "long"), nullptr);
}

TEST_F(SchedulerTest, FifoBlocksBehindTheHeadJob) {
  Make(OnePool(), Policy::kFifo);
  Submit(Job("r", 12, 12, 100), 0);
  Pass(0);
  Submit(Job("head", 16, 16, 100), 1);
  Submit(Job("short", 4, 4, 50), 2);
  EXPECT_TRUE(Pass(2).empty());
  EXPECT_THAT(Query("short").reason, HasSubstr("FIFO: behind job head"));
}

TEST_F(SchedulerTest, HighPriorityPreemptsTheVictimThatLosesLeastWork) {
  Make(ThreePools());
  Submit(Job("n", 8, 8, 1e5), 0);  // fills the normal pool
  Submit(Job("p1", 4, 4, 1e5, JobClass::kPreemptible), 0);
  Submit(Job("p2", 4, 4, 1e5, JobClass::kPreemptible), 0);
  Pass(0);
  // p2 found its pool full and borrowed the high pool.
  EXPECT_TRUE(Query("p2").borrowed);
  EXPECT_EQ(Query("p2").run_pool, "high");
  // p1 checkpointed recently, p2 never: preempting p1 loses less.
  ASSERT_TRUE(sched_->Checkpointed("p1", 900).ok());
  Submit(Job("h", 4, 4, 100, JobClass::kHigh), 1000);
  std::vector<Decision> d = Pass(1000);
  const Decision* pre = Find(d, DecisionKind::kPreempt, "p1");
  ASSERT_NE(pre, nullptr);
  EXPECT_THAT(pre->reason, HasSubstr("checkpoint and pause for job h"));
  EXPECT_THAT(pre->reason, HasSubstr("the least work lost"));
  EXPECT_EQ(Find(d, DecisionKind::kPreempt, "p2"), nullptr);
  const Decision* start = Find(d, DecisionKind::kStart, "h");
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(start->after, std::vector<std::string>{"p1"});
  EXPECT_TRUE(start->borrowed);
  EXPECT_EQ(start->pool, "preemptible");
  EXPECT_EQ(Query("p1").state, JobState::kPending);
  EXPECT_THAT(Query("p1").reason, HasSubstr("reason=Preempted (by job h"));
  EXPECT_EQ(Query("p1").preemptions, 1);

  // When capacity returns, p1 resumes from its checkpoint, possibly on other devices.
  ASSERT_TRUE(sched_->Finished("n", 2000).ok());
  d = Pass(2000);
  const Decision* resume = Find(d, DecisionKind::kStart, "p1");
  ASSERT_NE(resume, nullptr);
  EXPECT_TRUE(resume->resume);
  EXPECT_EQ(Query("p1").state, JobState::kRunning);
}

TEST_F(SchedulerTest, LentDevicesAreReclaimedByTheirPool) {
  Make(ThreePools());
  Submit(Job("n1", 8, 8, 1e5), 0);
  Submit(Job("p", 4, 4, 1e5, JobClass::kPreemptible), 0);
  Submit(Job("n2", 4, 4, 1e5), 0);  // the normal pool is full: borrows the high pool
  Pass(0);
  EXPECT_TRUE(Query("n2").borrowed);
  EXPECT_EQ(Query("n2").run_pool, "high");
  // A job of the lending pool takes its devices back (p would lose as much: home first).
  Submit(Job("back", 4, 4, 100, JobClass::kHigh), 10);
  std::vector<Decision> d = Pass(10);
  ASSERT_NE(Find(d, DecisionKind::kPreempt, "n2"), nullptr);
  EXPECT_THAT(Find(d, DecisionKind::kPreempt, "n2")->reason, HasSubstr("borrowed devices"));
  ASSERT_NE(Find(d, DecisionKind::kStart, "back"), nullptr);
  EXPECT_FALSE(Find(d, DecisionKind::kStart, "back")->borrowed);
}

TEST_F(SchedulerTest, ElasticJobsShrinkInsteadOfPausing) {
  Make(OnePool());
  Submit(Job("e", 4, 16, 1e5), 0);
  Pass(0);
  ASSERT_EQ(Query("e").devices.size(), 16u);
  Submit(Job("h", 4, 4, 100, JobClass::kHigh), 10);
  std::vector<Decision> d = Pass(10);
  const Decision* shrink = Find(d, DecisionKind::kShrink, "e");
  ASSERT_NE(shrink, nullptr);
  EXPECT_EQ(shrink->devices.size(), 12u);
  EXPECT_THAT(shrink->reason, HasSubstr("shrunk from 16 to 12 devices for job h"));
  EXPECT_EQ(Find(d, DecisionKind::kPreempt, "e"), nullptr);
  EXPECT_EQ(Query("e").state, JobState::kRunning);
  ASSERT_NE(Find(d, DecisionKind::kStart, "h"), nullptr);
  EXPECT_EQ(Find(d, DecisionKind::kStart, "h")->after, std::vector<std::string>{"e"});
  // When h ends, e grows back toward its maximum.
  ASSERT_TRUE(sched_->Finished("h", 110).ok());
  d = Pass(110);
  const Decision* grow = Find(d, DecisionKind::kGrow, "e");
  ASSERT_NE(grow, nullptr);
  EXPECT_EQ(grow->devices.size(), 16u);
}

// A job whose size cannot change while it runs (a command job) starts at what is free within
// its range and keeps it: idle devices do not grow it, and a higher class is not given its
// devices by a shrink. Its resizable twin is grown and shrunk in the same places.
TEST_F(SchedulerTest, AJobThatIsNotResizableStartsInItsRangeAndKeepsItsSize) {
  for (const bool resizable : {false, true}) {
    SCOPED_TRACE(resizable ? "resizable" : "not resizable");
    JobRequest fixed = Job("fixed", 2, 8, 1e5);
    fixed.resizable = resizable;
    // Started with 4 of 16 devices free; then the rest fall idle.
    Make(OnePool());
    Submit(Job("b", 12, 12, 1e5), 0);
    Pass(0);
    Submit(fixed, 1);
    Pass(1);
    ASSERT_EQ(Query("fixed").state, JobState::kRunning);
    EXPECT_EQ(Query("fixed").devices.size(), 4u);  // what was free, in its range
    ASSERT_TRUE(sched_->Finished("b", 3000).ok());
    std::vector<Decision> d = Pass(3000);
    EXPECT_EQ(Find(d, DecisionKind::kGrow, "fixed") != nullptr, resizable);
    // Beside a job of its size on a full machine, a high job of 2 arrives.
    Make(OnePool());
    Submit(fixed, 0);
    Submit(Job("other", 8, 8, 1e5), 0);
    Pass(0);
    ASSERT_EQ(Query("fixed").devices.size(), 8u);
    Submit(Job("h", 2, 2, 100, JobClass::kHigh), 1000);
    d = Pass(1000);
    EXPECT_NE(Find(d, DecisionKind::kStart, "h"), nullptr);
    EXPECT_EQ(Find(d, DecisionKind::kShrink, "fixed") != nullptr, resizable);
  }
}

// A job on one host starts at the size one host has free, within its range, and grows on
// that host only; one that no host can hold at its minimum is refused.
TEST_F(SchedulerTest, AOneHostJobStartsAtWhatOneHostHasAndGrowsThere) {
  Make(OnePool());
  auto host_of = [&](const std::vector<int>& devs) {
    std::set<int> hosts;
    for (int d : devs) hosts.insert(topo_.host_of(d));
    return hosts;
  };
  // Three devices busy on every host: one free on each.
  for (std::string id : {"a", "b", "c", "d"}) Submit(Job(id, 3, 3, 1e5), 0);
  Pass(0);
  JobRequest one = Job("one", 1, 4, 1e5);
  one.one_host = true;
  Submit(one, 1);
  Pass(1);
  ASSERT_EQ(Query("one").state, JobState::kRunning);
  ASSERT_EQ(Query("one").devices.size(), 1u);  // spread over hosts it could have had 4
  const std::set<int> home = host_of(Query("one").devices);
  // Its host's neighbour ends, and another host's: it grows on its own host alone.
  for (std::string id : {"a", "b", "c", "d"}) {
    if (host_of(Query(id).devices) == home || id == (home.count(0) ? "b" : "a")) {
      ASSERT_TRUE(sched_->Finished(id, 2000).ok());
    }
  }
  const std::vector<Decision> d = Pass(2000);
  const Decision* grow = Find(d, DecisionKind::kGrow, "one");
  ASSERT_NE(grow, nullptr);
  EXPECT_EQ(grow->devices.size(), 4u);
  EXPECT_EQ(host_of(grow->devices), home);

  JobRequest wide = Job("wide", 5, 8, 1e5);
  wide.one_host = true;
  Status s = sched_->Submit(wide, 2001);
  EXPECT_THAT(s.message(), HasSubstr("at least 5 devices on one host"));
}

TEST_F(SchedulerTest, FrequentFaultsDemoteAJob) {
  Make(OnePool());
  Submit(Job("buggy", 2, 2, 1e5), 0);
  Pass(0);
  std::vector<Decision> all;
  for (double t : {100.0, 200.0, 300.0}) {
    ASSERT_TRUE(sched_->Faulted("buggy", t).ok());
    std::vector<Decision> d = Pass(t);
    all.insert(all.end(), d.begin(), d.end());
  }
  const Decision* demote = Find(all, DecisionKind::kDemote, "buggy");
  ASSERT_NE(demote, nullptr);
  EXPECT_THAT(demote->reason, HasSubstr("3 faults"));
  EXPECT_THAT(demote->reason, HasSubstr("passes the threshold 2/h"));
  EXPECT_EQ(demote->level, 0);
  EXPECT_EQ(Query("buggy").level, 0);
  EXPECT_EQ(Query("buggy").faults, 3);
  // Its own faults shorten its checkpoint interval.
  std::vector<double> intervals;
  for (const Decision& d : all) {
    if (d.kind == DecisionKind::kInterval) intervals.push_back(d.checkpoint_interval_s);
  }
  ASSERT_GE(intervals.size(), 2u);
  EXPECT_LT(intervals.back(), intervals.front());
  EXPECT_LT(intervals.back(), 450);
}

TEST_F(SchedulerTest, FairShareFavoursTheTeamThatUsedLess) {
  Make(OnePool());
  Submit(Job("heavy", 16, 16, 3600, JobClass::kNormal, "big"), 0);
  Pass(0);
  ASSERT_TRUE(sched_->Finished("heavy", 3600).ok());
  Submit(Job("hog", 16, 16, 3600, JobClass::kNormal, "hog"), 3600);  // keeps the cluster busy
  Pass(3600);
  Submit(Job("from-big", 16, 16, 100, JobClass::kNormal, "big"), 3601);
  Submit(Job("from-small", 16, 16, 100, JobClass::kNormal, "small"), 3602);
  Pass(3602);
  ASSERT_TRUE(sched_->Finished("hog", 7200).ok());
  std::vector<Decision> d = Pass(7200);
  // Both teams wait; "small" has used nothing, so its later job goes first.
  EXPECT_NE(Find(d, DecisionKind::kStart, "from-small"), nullptr);
  EXPECT_EQ(Find(d, DecisionKind::kStart, "from-big"), nullptr);
}

TEST_F(SchedulerTest, DevicesGoingDownShrinkElasticJobsAndRequeueOthers) {
  Make(OnePool());
  Submit(Job("rigid", 4, 4, 1e5), 0);
  Submit(Job("elastic", 4, 12, 1e5), 0);
  Pass(0);
  const std::vector<int> rigid = Query("rigid").devices;
  const std::vector<int> elastic = Query("elastic").devices;
  ASSERT_TRUE(sched_->DevicesDown({rigid[0], elastic[0]}, 50).ok());
  std::vector<Decision> d = Pass(50);
  EXPECT_NE(Find(d, DecisionKind::kShrink, "elastic"), nullptr);
  EXPECT_EQ(Query("elastic").state, JobState::kRunning);
  for (int dev : Query("elastic").devices) EXPECT_NE(dev, elastic[0]);
  // rigid went back to the queue and, the same pass, restarted elsewhere from its checkpoint.
  EXPECT_NE(Find(d, DecisionKind::kPreempt, "rigid"), nullptr);
  const Decision* again = Find(d, DecisionKind::kStart, "rigid");
  if (again != nullptr) {
    EXPECT_TRUE(again->resume);
    for (int dev : again->devices) EXPECT_NE(dev, rigid[0]);
  }
  EXPECT_TRUE(sched_->DevicesUp({rigid[0], elastic[0]}, 60).ok());
  EXPECT_FALSE(sched_->DevicesDown({99}, 70).ok());
}

TEST_F(SchedulerTest, BadRequestsAreRefusedAtOnceWithTheReason) {
  Make(ThreePools());
  auto refuse = [&](JobRequest r) { return sched_->Submit(r, 0).message(); };
  EXPECT_THAT(refuse(Job("a", 4, 2)), HasSubstr("min_devices 4 is above max_devices 2"));
  JobRequest tp = Job("b", 3, 4);
  tp.tp = 2;
  EXPECT_THAT(refuse(tp), HasSubstr("tp 2 must divide"));
  JobRequest kind = Job("c", 1, 1);
  kind.kind = "TPU-v9";
  EXPECT_THAT(refuse(kind), HasSubstr("unknown device kind \"TPU-v9\""));
  JobRequest pool = Job("d", 1, 1);
  pool.pool = "gpu-farm";
  EXPECT_THAT(refuse(pool),
              HasSubstr("unknown pool \"gpu-farm\" (pools: high, preemptible, normal)"));
  EXPECT_THAT(refuse(Job("e", 20, 20)),
              HasSubstr("asks for at least 20 devices, above the capacity of every pool"));
  EXPECT_THAT(refuse(Job("", 1, 1)), HasSubstr("empty job id"));
  ASSERT_TRUE(sched_->Submit(Job("f", 1, 1), 0).ok());
  EXPECT_THAT(refuse(Job("f", 1, 1)), HasSubstr("in use"));
  EXPECT_EQ(sched_->Query("nope").status().code(), ErrorCode::kNotFound);

  PoolConfig team_only;
  team_only.pools.push_back(
      {.name = "vision", .classes = {JobClass::kNormal}, .teams = {"vision"}, .rest = true});
  Make(team_only);
  EXPECT_THAT(refuse(Job("g", 1, 1, 10, JobClass::kNormal, "nlp")),
              HasSubstr("no pool takes class normal for team nlp"));
  EXPECT_TRUE(sched_->Submit(Job("h", 1, 1, 10, JobClass::kNormal, "vision"), 0).ok());
}

TEST_F(SchedulerTest, KindMatchesAModelOrAKindName) {
  Make(OnePool());
  JobRequest by_model = Job("m", 2, 2);
  by_model.kind = "M";
  JobRequest by_kind = Job("k", 2, 2);
  by_kind.kind = "simulated";
  Submit(by_model, 0);
  Submit(by_kind, 0);
  Pass(0);
  EXPECT_EQ(Query("m").state, JobState::kRunning);
  EXPECT_EQ(Query("k").state, JobState::kRunning);
}

TEST_F(SchedulerTest, PartitionFollowsHostsAndRacks) {
  PoolConfig c;
  c.pools.push_back({.name = "small", .classes = {JobClass::kHigh}, .devices = 6});
  c.pools.push_back({.name = "rest", .classes = {JobClass::kNormal}, .rest = true});
  Result<std::vector<Pool>> pools = PartitionPools(topo_, c);
  ASSERT_TRUE(pools.ok()) << pools.status().message();
  // Six devices: host a0 whole, then two of a1.
  EXPECT_EQ((*pools)[0].devices, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ((*pools)[1].devices.size(), 10u);
}

}  // namespace
}  // namespace kc::sched
