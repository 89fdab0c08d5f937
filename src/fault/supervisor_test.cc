// The runtime of L5 with ranks as threads of this process (gloo's test harness style): a
// Supervisor over a ThreadLauncher whose ranks are ElasticWorkers, all on one in-memory store.
// Ranks are killed, silenced and stopped at chosen steps; the survivors shrink, replacements
// grow the run back, uneven shares keep every survivor busy, and the losses stay those of a run
// that was never interrupted.
#include "fault/supervisor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/mutex.h"
#include "base/notification.h"
#include "comm/hash_store.h"
#include "fault/elastic_worker.h"
#include "fault/thread_launcher.h"
#include "parallel/training_test_support.h"

namespace kc::fault {
namespace {

using parallel::testing::MaxRelativeDifference;
using parallel::testing::OneCore;
using parallel::testing::TinyCorpus;
using parallel::testing::TinyModel;
using ::testing::HasSubstr;

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const TinyCorpus& Corpus() {
  static const TinyCorpus corpus;
  return corpus;
}

// What a drill does to a worker before one of its steps.
struct Drill {
  enum class How {
    kKill,              // kill -9: its connections fail, its communicator aborts
    kSilence,           // SIGSTOP: its heartbeats stop and it blocks, until the supervisor kills it
    kSilenceAfterBeat,  // kSilence once its heartbeat has published its last step's progress
    kStop,       // a stop request to the supervisor, as SIGTERM to kc train; the worker goes on
                 // once the stop reached it
    kAwaitJoin,  // waits until a replacement has joined (or its generation ends)
    kResize,     // Supervisor::Resize(ranks), as the scheduler's grow or shrink
    kInspect,    // holds back from its step, asking Supervisor::Inspect until the answer says
                 // the others wait for it (RunResult::inspected)
  };
  int worker = 0;
  int64_t step = 0;  // 1-based: before this step
  How how = How::kKill;
  int ranks = 0;          // kResize
  std::vector<int> with;  // kKill: killed with it, as ranks of one host
};

struct RunSpec {
  int ranks = 4;
  int min_ranks = 0;  // 0: ranks (not elastic)
  int max_ranks = 0;  // 0: ranks
  int max_restarts = 0;
  int t = 1;
  int64_t global_batch = 8;
  int64_t steps = 8;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::string resume_from;
  int64_t memory_copy_every = 0;
  std::vector<Drill> drills;
  // What the launcher says has no place any more (ProcessLauncher::Overplaced), as a remote
  // launcher does for the ranks of a host the run was shrunk off.
  std::vector<int> overplaced;
};

// A launcher that passes everything on and names fixed workers overplaced.
class Overplacing final : public ProcessLauncher {
 public:
  Overplacing(ProcessLauncher* base, std::vector<int> overplaced)
      : base_(base), overplaced_(std::move(overplaced)) {}
  Status Start(const RankLaunch& launch, RankEvents* events) override {
    return base_->Start(launch, events);
  }
  void Signal(int worker, RankSignal signal) override { base_->Signal(worker, signal); }
  std::vector<int> Overplaced() const override { return overplaced_; }

 private:
  ProcessLauncher* const base_;
  const std::vector<int> overplaced_;
};

struct RunResult {
  RunOutcome outcome;
  std::vector<double> losses;  // by step; after a recovery the later reports count
  std::vector<FaultEvent> faults;
  std::vector<int> replacements;
  int64_t last_checkpoint = -1;
  int64_t resumed_from = -1;
  std::optional<ProgressSnapshot> inspected;  // kInspect: the answer that named the others
};

class Recorder final : public SupervisorObserver {
 public:
  explicit Recorder(RunResult* out) : out_(out) {}
  Notification joined;
  void OnReport(int, const Report& report) override {
    if (const auto* s = std::get_if<StepReport>(&report)) {
      while (!steps_.empty() && steps_.back() >= s->step) {
        steps_.pop_back();
        out_->losses.pop_back();
      }
      steps_.push_back(s->step);
      out_->losses.push_back(s->loss);
    } else if (const auto* c = std::get_if<CheckpointReport>(&report)) {
      out_->last_checkpoint = c->step;
    } else if (const auto* r = std::get_if<ResumeReport>(&report)) {
      out_->resumed_from = r->step;
    }
  }
  void OnFault(const FaultEvent& event) override {
    out_->faults.push_back(event);
    if (event.kind == FaultEvent::Kind::kJoined && !joined.HasBeenNotified()) joined.Notify();
  }
  void OnProgress(const ProgressSnapshot& snapshot) override {
    MutexLock lock(&mu_);
    answers_.push_back(snapshot);
    cv_.SignalAll();
  }
  // Waits up to 10 s for the answer to request `request`.
  std::optional<ProgressSnapshot> Answer(int64_t request) {
    MutexLock lock(&mu_);
    const TimePoint until = Clock::Real()->Now() + std::chrono::seconds(10);
    for (;;) {
      for (const ProgressSnapshot& a : answers_) {
        if (a.request == request) return a;
      }
      if (!AwaitWithDeadline(Clock::Real(), &cv_, &mu_, until, [&]() KC_REQUIRES(mu_) {
            return !answers_.empty() && answers_.back().request == request;
          })) {
        return std::nullopt;
      }
    }
  }
  void OnReplacement(int worker, const Status& started) override {
    EXPECT_TRUE(started.ok()) << started;
    out_->replacements.push_back(worker);
  }

 private:
  RunResult* const out_;
  std::vector<int64_t> steps_;
  Mutex mu_;
  CondVar cv_;
  std::vector<ProgressSnapshot> answers_ KC_GUARDED_BY(mu_);
};

// Runs `spec` to its end: a supervisor on this thread, every rank a thread.
RunResult Train(const RunSpec& spec) {
  static int runs = 0;
  const std::string job = "rt-" + std::to_string(getpid()) + "-" + std::to_string(runs++);
  const ElasticShape shape{.t = spec.t,
                           .global_batch = spec.global_batch,
                           .micro_batch_size = spec.global_batch / (spec.ranks / spec.t),
                           .micro_batches = 1,
                           .min_ranks = spec.min_ranks > 0 ? spec.min_ranks : spec.ranks,
                           .max_ranks = spec.max_ranks > 0 ? spec.max_ranks : spec.ranks};
  const bool several = spec.ranks > 1 || spec.max_ranks > spec.ranks;
  const HeartbeatOptions heartbeat{
      .period = Seconds(0.05), .timeout = Seconds(2), .first_beat = Seconds(60)};
  comm::HashStore store;
  RunResult out;
  Recorder recorder(&out);
  std::unique_ptr<Supervisor> supervisor;
  ThreadLauncher launcher(
      {.store = &store, .body = [&](RankContext& rank) -> Status {
         auto device = OneCore(rank.worker());
         Notification killed;
         ElasticWorkerOptions o;
         o.worker = rank.worker();
         o.join = rank.join();
         o.ranks = spec.ranks;
         o.shape = shape;
         o.job = job;
         if (several) {
           o.connect = [&]() -> Result<std::unique_ptr<comm::Store>> { return rank.Connect(); };
         }
         o.timeout = std::chrono::seconds(60);
         o.heartbeat = heartbeat;
         o.trainer.spec = TinyModel();
         o.trainer.data = Corpus().train();
         o.trainer.total_steps = spec.steps;
         o.trainer.device = device.get();
         o.trainer.plan.t = spec.t;
         o.runner.steps = spec.steps;
         o.runner.checkpoint.dir = spec.checkpoint_dir;
         o.runner.checkpoint_every = spec.checkpoint_every;
         o.runner.resume_from = spec.resume_from;
         o.memory_copy_every = spec.memory_copy_every;
         o.runner.model = ModelFingerprint(o.trainer.spec);
         o.stop_requested = rank.stop_requested();
         o.observer = rank.observer();
         o.hooks.before_step = [&](int64_t next) {
           for (const Drill& d : spec.drills) {
             if (d.worker != rank.worker() || d.step != next) continue;
             switch (d.how) {
               case Drill::How::kKill:
                 for (int w : d.with) launcher.Signal(w, RankSignal::kKill);
                 launcher.Signal(d.worker, RankSignal::kKill);
                 break;
               case Drill::How::kSilenceAfterBeat:
                 // Until a beat has said where it is now: every
                 // operation of its last step finished.
                 for (;;) {
                   Result<std::string> p = store.Get(
                       ProgressKey(d.worker), Clock::Real()->Now() + std::chrono::seconds(10));
                   if (!p.ok() || (p->find("\"done\":true") != std::string::npos &&
                                   p->find("\"done\":false") == std::string::npos &&
                                   p->find("allreduce") != std::string::npos)) {
                     break;
                   }
                   std::this_thread::yield();
                 }
                 [[fallthrough]];
               case Drill::How::kSilence:
                 launcher.Silence(d.worker);
                 killed.WaitForNotification();
                 break;
               case Drill::How::kStop:
                 supervisor->RequestStop();
                 rank.stop_requested()->wait(false);
                 break;
               case Drill::How::kAwaitJoin:
                 recorder.joined.WaitForNotification();
                 break;
               case Drill::How::kResize:
                 supervisor->Resize(d.ranks);
                 break;
               case Drill::How::kInspect:
                 // Until a heartbeat of the others has published them waiting in the
                 // all-reduce worker 2 has not entered since its own last beat (for up to
                 // 20 s).
                 for (int64_t request = 1, until = WallMs() + 20000; WallMs() < until; ++request) {
                   supervisor->Inspect(request);
                   std::optional<ProgressSnapshot> a = recorder.Answer(request);
                   if (!a) break;
                   if (a->hang.find("worker 2 has not entered it (last: allreduce") !=
                       std::string::npos) {
                     out.inspected = std::move(a);
                     break;
                   }
                 }
                 break;
             }
           }
         };
         ElasticWorker worker(o);
         auto hook = rank.OnKill([&](Status why) {
           worker.Abort(why);
           killed.Notify();
         });
         Result<int> r = worker.Run();
         if (r.ok() || r.status().code() == ErrorCode::kCancelled) {
           return OkStatus();
         }
         return r.status();
       }});
  Overplacing overplacing(&launcher, spec.overplaced);
  auto created = Supervisor::Create({.ranks = spec.ranks,
                                     .shape = shape,
                                     .max_restarts = spec.max_restarts,
                                     .heartbeat = heartbeat,
                                     .store = several ? &store : nullptr,
                                     .launcher = &overplacing,
                                     .observer = &recorder});
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return out;
  supervisor = *std::move(created);
  Result<RunOutcome> outcome = supervisor->Run();
  EXPECT_TRUE(outcome.ok()) << outcome.status();
  if (outcome.ok()) out.outcome = *outcome;
  return out;
}

// One rank, never interrupted: the trajectory every other run must follow.
const std::vector<double>& Uninterrupted() {
  static const std::vector<double> losses = [] {
    RunResult one = Train({.ranks = 1});
    EXPECT_EQ(one.outcome.end, RunOutcome::End::kCompleted);
    return one.losses;
  }();
  return losses;
}

const FaultEvent* Find(const RunResult& r, FaultEvent::Kind kind) {
  for (const FaultEvent& e : r.faults) {
    if (e.kind == kind) return &e;
  }
  return nullptr;
}

// Over world sizes, as gloo's tests do: 1, powers of two and not (8 sequences over 3: 3, 3, 2;
// over 5: 2, 2, 2, 1, 1).
class SupervisorWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(SupervisorWorldTest, RanksThatAllFinishCompleteTheRunWithTheLossesOfOneRank) {
  RunResult r = Train({.ranks = GetParam()});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(r.outcome.faults, 0);
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Uninterrupted()), 1e-5);
  EXPECT_TRUE(r.faults.empty());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SupervisorWorldTest, ::testing::Values(1, 2, 3, 5));

// n ranks lose their last one: all n - 1 survivors go on (4 of 5: 2, 2, 2, 2; 2 of 3: 4, 4).
class SupervisorKillTest : public ::testing::TestWithParam<int> {};

TEST_P(SupervisorKillTest, EverySurvivorOfAKillGoesOnWithTheLossesOfOneRank) {
  const int n = GetParam();
  RunResult r = Train({.ranks = n, .min_ranks = 1, .drills = {{.worker = n - 1, .step = 3}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  const FaultEvent* recovered = Find(r, FaultEvent::Kind::kRecovered);
  ASSERT_NE(recovered, nullptr);
  EXPECT_EQ(recovered->ranks, n - 1);
  EXPECT_EQ(recovered->source, "replica");
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Uninterrupted()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SupervisorKillTest, ::testing::Values(2, 3, 4, 5));

TEST(SupervisorTest, AKilledRankOfARunThatIsNotElasticStopsTheOthers) {
  RunResult r = Train({.ranks = 3, .drills = {{.worker = 1, .step = 3}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kFailed);
  ASSERT_TRUE(r.outcome.cause.has_value());
  EXPECT_EQ(r.outcome.cause->worker, 1);
  EXPECT_TRUE(r.outcome.cause->exit.killed);
  EXPECT_EQ(r.outcome.cause->generation, -1);
  // Step 3 needs rank 1's gradients.
  EXPECT_LE(r.losses.size(), 2u);
}

TEST(SupervisorTest, TheThreeSurvivorsOfFourGoOnWithUnevenSharesAndTheSameLosses) {
  // 8 sequences: 2 each on 4 ranks, then 3, 3, 2 on the survivors (not 2 replicas of 4).
  RunResult r = Train({.ranks = 4, .min_ranks = 2, .drills = {{.worker = 2, .step = 5}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(r.outcome.faults, 1);
  const FaultEvent* detected = Find(r, FaultEvent::Kind::kDetected);
  ASSERT_NE(detected, nullptr);
  EXPECT_EQ(detected->worker, 2);
  EXPECT_EQ(detected->generation, 1);
  EXPECT_EQ(detected->ranks, 3);
  const FaultEvent* recovered = Find(r, FaultEvent::Kind::kRecovered);
  ASSERT_NE(recovered, nullptr);
  EXPECT_EQ(recovered->ranks, 3);
  EXPECT_EQ(recovered->d, 3);
  EXPECT_EQ(recovered->source, "replica");
  EXPECT_EQ(recovered->step, 4);
  EXPECT_EQ(recovered->steps_lost, 0);
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Uninterrupted()), 1e-5);
}

TEST(SupervisorTest, AReplacementJoinsAndTheRunGrowsBack) {
  RunResult r = Train({.ranks = 4,
                       .min_ranks = 2,
                       .max_restarts = 1,
                       .steps = 12,
                       .drills = {{.worker = 1, .step = 3},
                                  {.worker = 0, .step = 8, .how = Drill::How::kAwaitJoin}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_THAT(r.replacements, ::testing::ElementsAre(4));
  const FaultEvent* joined = Find(r, FaultEvent::Kind::kJoined);
  ASSERT_NE(joined, nullptr) << "the run ended before the replacement was up";
  EXPECT_EQ(joined->worker, 4);
  EXPECT_EQ(joined->ranks, 4);
  bool recovered_with_4 = false;
  for (const FaultEvent& e : r.faults) {
    recovered_with_4 = recovered_with_4 || (e.kind == FaultEvent::Kind::kRecovered && e.ranks == 4);
  }
  EXPECT_TRUE(recovered_with_4);
  const std::vector<double> base = Train({.ranks = 1, .steps = 12}).losses;
  ASSERT_EQ(r.losses.size(), 12u);
  EXPECT_LE(MaxRelativeDifference(r.losses, base), 1e-5);
}

// A lone survivor has no communicator the next generation's announcement could abort: it
// leaves its generation between steps, and the replacement joins it (the run grows back to 2).
TEST(SupervisorTest, ALoneSurvivorTakesInAReplacementAndTheRunGrowsBack) {
  RunResult r = Train({.ranks = 2,
                       .min_ranks = 1,
                       .max_restarts = 1,
                       .global_batch = 4,
                       .steps = 40,
                       .drills = {{.worker = 1, .step = 3},
                                  {.worker = 0, .step = 6, .how = Drill::How::kAwaitJoin}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  std::vector<int> recovered_ranks;
  for (const FaultEvent& e : r.faults) {
    if (e.kind == FaultEvent::Kind::kRecovered) recovered_ranks.push_back(e.ranks);
  }
  EXPECT_THAT(recovered_ranks, ::testing::ElementsAre(1, 2));
  ASSERT_EQ(r.losses.size(), 40u);
  EXPECT_LE(
      MaxRelativeDifference(r.losses, Train({.ranks = 1, .global_batch = 4, .steps = 40}).losses),
      1e-5);
}

// Both tensor-parallel rank 1s of a t = 2, d = 2 run are lost at once (a host's ranks): no
// replica holds that position any more. With in-memory copies every 2 steps, the survivors
// roll back to the copies of step 4 (each rank's copy is held by the next rank; a checkpoint
// of step 4 is no newer) and go on as one replica, with the uninterrupted run's losses.
// Without them, and without a checkpoint to go back to, the run cannot go on.
TEST(SupervisorTest, ALostPositionComesBackFromTheInMemoryCopiesOfItsState) {
  const std::string dir = ::testing::TempDir() + "kc_memory_copy_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  RunResult r = Train({.ranks = 4,
                       .min_ranks = 2,
                       .t = 2,
                       .steps = 10,
                       .checkpoint_dir = dir,
                       .checkpoint_every = 2,
                       .memory_copy_every = 2,
                       .drills = {{.worker = 3, .step = 6, .with = {1}}}});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted) << r.outcome.error;
  const FaultEvent* recovered = nullptr;
  for (const FaultEvent& e : r.faults) {
    if (e.kind == FaultEvent::Kind::kRecovered) recovered = &e;
  }
  ASSERT_NE(recovered, nullptr);
  EXPECT_EQ(recovered->ranks, 2);
  EXPECT_EQ(recovered->source, "memory");
  EXPECT_EQ(recovered->step, 4);
  ASSERT_EQ(r.losses.size(), 10u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Train({.ranks = 1, .steps = 10}).losses), 1e-5);

  RunResult without = Train({.ranks = 4,
                             .min_ranks = 2,
                             .t = 2,
                             .steps = 10,
                             .drills = {{.worker = 3, .step = 6, .with = {1}}}});
  EXPECT_NE(without.outcome.end, RunOutcome::End::kCompleted);
  std::string why;
  for (const FaultEvent& e : without.faults) why += e.reason + "\n";
  EXPECT_THAT(why, HasSubstr("no in-memory copy of their state either, and there is no "
                             "checkpoint directory"));
}

// A replacement announced as the survivors take their last step: they finish the training
// before the generation with it forms, so it never forms; the replacement is stopped and the
// run is complete, not a failure below the minimum.
TEST(SupervisorTest, AReplacementJoiningAsTheLastStepEndsIsStoppedAndTheRunCompletes) {
  RunResult r = Train({.ranks = 2,
                       .min_ranks = 1,
                       .max_restarts = 1,
                       .global_batch = 4,
                       .steps = 6,
                       .drills = {{.worker = 1, .step = 3},
                                  {.worker = 0, .step = 6, .how = Drill::How::kAwaitJoin}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(r.outcome.faults, 1);  // the kill; not the replacement's stop
  EXPECT_THAT(r.replacements, ::testing::ElementsAre(2));
  ASSERT_EQ(r.losses.size(), 6u);
  EXPECT_LE(
      MaxRelativeDifference(r.losses, Train({.ranks = 1, .global_batch = 4, .steps = 6}).losses),
      1e-5);
}

std::vector<int> RecoveredRanks(const RunResult& r) {
  std::vector<int> ranks;
  for (const FaultEvent& e : r.faults) {
    if (e.kind == FaultEvent::Kind::kRecovered) ranks.push_back(e.ranks);
  }
  return ranks;
}

// The scheduler's grow: a run started at 1 of at most 3 asked for 3 starts two workers, which
// join; the three take uneven shares (8 sequences: 3, 3, 2) and the losses stay those of one
// rank.
TEST(SupervisorTest, AResizeUpStartsWorkersThatJoinTheRun) {
  RunResult r = Train({.ranks = 1,
                       .min_ranks = 1,
                       .max_ranks = 3,
                       .steps = 12,
                       .drills = {{.worker = 0, .step = 3, .how = Drill::How::kResize, .ranks = 3},
                                  {.worker = 0, .step = 8, .how = Drill::How::kAwaitJoin}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(r.outcome.faults, 0);
  EXPECT_THAT(r.replacements, ::testing::ElementsAre(1, 2));
  const FaultEvent* resized = Find(r, FaultEvent::Kind::kResized);
  ASSERT_NE(resized, nullptr);
  EXPECT_EQ(resized->ranks, 3);
  EXPECT_THAT(resized->reason, HasSubstr("starting 2 more"));
  // Both in one generation, or one and then the other.
  const std::vector<int> sizes = RecoveredRanks(r);
  ASSERT_FALSE(sizes.empty());
  EXPECT_GT(sizes.front(), 1);
  ASSERT_EQ(r.losses.size(), 12u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Train({.ranks = 1, .steps = 12}).losses), 1e-5);
}

// The scheduler's shrink: a run of 3 asked for 1 retires its two newest workers; the one left
// goes on from its own state. No fault; nothing of the trajectory changes. A resize beyond the
// range is held to it (4 of at most 3: 3, nothing to start).
TEST(SupervisorTest, AResizeDownRetiresTheNewestWorkersAndTheRestGoOn) {
  RunResult r =
      Train({.ranks = 3,
             .min_ranks = 1,
             .drills = {{.worker = 0, .step = 2, .how = Drill::How::kResize, .ranks = 4},
                        {.worker = 0, .step = 4, .how = Drill::How::kResize, .ranks = 1}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(r.outcome.faults, 0);
  EXPECT_EQ(Find(r, FaultEvent::Kind::kDetected), nullptr);
  EXPECT_TRUE(r.replacements.empty());
  const FaultEvent* resized = Find(r, FaultEvent::Kind::kResized);
  ASSERT_NE(resized, nullptr);
  EXPECT_EQ(resized->ranks, 1);
  EXPECT_THAT(resized->reason, HasSubstr("retiring workers 2, 1"));
  EXPECT_THAT(RecoveredRanks(r), ::testing::ElementsAre(1));
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Uninterrupted()), 1e-5);
}

// A shrink off one host: the workers the launcher has no place for go first (worker 1, not the
// newest), then the newest; the one left goes on with the same trajectory.
TEST(SupervisorTest, AResizeDownRetiresTheOverplacedWorkersFirst) {
  RunResult r = Train({.ranks = 3,
                       .min_ranks = 1,
                       .drills = {{.worker = 0, .step = 3, .how = Drill::How::kResize, .ranks = 1}},
                       .overplaced = {1}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(r.outcome.faults, 0);
  const FaultEvent* resized = Find(r, FaultEvent::Kind::kResized);
  ASSERT_NE(resized, nullptr);
  EXPECT_THAT(resized->reason, HasSubstr("retiring workers 1, 2"));
  EXPECT_THAT(RecoveredRanks(r), ::testing::ElementsAre(1));
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Uninterrupted()), 1e-5);
}

TEST(SupervisorTest, ASilentRankIsFoundByItsHeartbeatsKilledAndTheOthersGoOn) {
  RunResult r = Train({.ranks = 3,
                       .min_ranks = 2,
                       .drills = {{.worker = 1, .step = 4, .how = Drill::How::kSilence}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  const FaultEvent* detected = Find(r, FaultEvent::Kind::kDetected);
  ASSERT_NE(detected, nullptr);
  EXPECT_EQ(detected->worker, 1);
  EXPECT_GT(detected->silent_s, 0);
  EXPECT_THAT(detected->reason, HasSubstr("sent no heartbeat"));
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Uninterrupted()), 1e-5);
}

// A rank that stops between steps (SIGSTOP) is named by the hang report its silence brings:
// the others wait in the next all-reduce, which it has not entered.
TEST(SupervisorTest, TheHangReportNamesTheRankTheOthersWaitFor) {
  RunResult r =
      Train({.ranks = 3,
             .min_ranks = 2,
             .steps = 40,
             .drills = {{.worker = 1, .step = 30, .how = Drill::How::kSilenceAfterBeat}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  const FaultEvent* detected = Find(r, FaultEvent::Kind::kDetected);
  ASSERT_NE(detected, nullptr);
  EXPECT_EQ(detected->worker, 1);
  EXPECT_THAT(detected->hang, ::testing::ContainsRegex(
                                  "allreduce #[0-9]+ of .*: worker 1 has not entered it \\(last: "
                                  "allreduce #[0-9]+, finished\\); workers 0, 2 wait in it"));
  EXPECT_THAT(detected->reason, HasSubstr("hang report: "));
  EXPECT_EQ(detected->ToJson().value("hang", ""), detected->hang);
}

// Asked while the run goes on (kc diagnose --live), the supervisor says where every rank is:
// here worker 2 holds back from step 6, and the others wait in its all-reduce. Each rank's
// newest operations come with it, finished ones with their time.
TEST(SupervisorTest, InspectSaysWhereEveryRankIsWhileTheRunGoesOn) {
  RunResult r = Train(
      {.ranks = 3, .steps = 8, .drills = {{.worker = 2, .step = 6, .how = Drill::How::kInspect}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(r.outcome.faults, 0);
  ASSERT_TRUE(r.inspected.has_value());
  EXPECT_EQ(r.inspected->workers, (std::vector<int>{0, 1, 2}));
  EXPECT_THAT(r.inspected->hang,
              ::testing::ContainsRegex("allreduce #[0-9]+ of .*: worker 2 has not entered it "
                                       "\\(last: allreduce #[0-9]+, finished\\); workers 0, 1 "
                                       "wait in it"));
  ASSERT_EQ(r.inspected->progress.size(), 3u);
  const nlohmann::json zero = nlohmann::json::parse(r.inspected->progress.at(0));
  ASSERT_TRUE(zero.is_array() && !zero.empty());
  const nlohmann::json& recent = zero[0]["recent"];
  ASSERT_GE(recent.size(), 2u);  // five steps and more of all-reduces, the newest kOpHistory
  EXPECT_LE(recent.size(), static_cast<size_t>(comm::kOpHistory));
  EXPECT_EQ(recent.back()["seq"], zero[0]["seq"]);
  EXPECT_FALSE(recent.back().contains("took_s"));  // the one it waits in
  EXPECT_TRUE(recent[recent.size() - 2].contains("took_s"));
  for (size_t i = 1; i < recent.size(); ++i) {
    EXPECT_EQ(recent[i]["seq"].get<uint64_t>(), recent[i - 1]["seq"].get<uint64_t>() + 1);
  }
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LE(MaxRelativeDifference(r.losses, Uninterrupted()), 1e-5);
}

TEST(SupervisorTest, AStopStopsEveryRankAfterTheSameStepWithACheckpointToResumeFrom) {
  const kc::testing::TempDir dir("kc_supervisor_stop");
  const std::string ckpt = dir.Path("ckpt");
  RunResult stopped = Train({.ranks = 3,
                             .checkpoint_dir = ckpt,
                             .drills = {{.worker = 2, .step = 4, .how = Drill::How::kStop}}});
  EXPECT_EQ(stopped.outcome.end, RunOutcome::End::kStopped);
  const int64_t last = static_cast<int64_t>(stopped.losses.size());
  ASSERT_GE(last, 3);
  ASSERT_LT(last, 8);
  EXPECT_EQ(stopped.last_checkpoint, last);
  Result<CheckpointEntry> newest = LatestGoodCheckpoint(ckpt, nullptr);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, last);
  // Resumed on another count of ranks: the rest of the uninterrupted trajectory.
  RunResult resumed = Train({.ranks = 2, .checkpoint_dir = ckpt, .resume_from = newest->path});
  EXPECT_EQ(resumed.outcome.end, RunOutcome::End::kCompleted);
  EXPECT_EQ(resumed.resumed_from, last);
  std::vector<double> rest(Uninterrupted().begin() + last, Uninterrupted().end());
  EXPECT_LE(MaxRelativeDifference(resumed.losses, rest), 1e-5);
}

TEST(SupervisorTest, BelowTheMinimumTheRunStopsWithACheckpointOfWhatSurvived) {
  // t=2, d=2: losing worker 3 leaves one whole replica, 2 ranks, below 3.
  const kc::testing::TempDir dir("kc_supervisor_below");
  const std::string ckpt = dir.Path("ckpt");
  RunResult r = Train({.ranks = 4,
                       .min_ranks = 3,
                       .t = 2,
                       .checkpoint_dir = ckpt,
                       .drills = {{.worker = 3, .step = 4}}});
  EXPECT_EQ(r.outcome.end, RunOutcome::End::kBelowMinimum);
  ASSERT_TRUE(r.outcome.cause.has_value());
  EXPECT_EQ(r.outcome.cause->worker, 3);
  EXPECT_TRUE(r.outcome.cause->below_minimum);
  EXPECT_EQ(r.outcome.cause->alive, 3);
  EXPECT_EQ(r.outcome.cause->usable, 2);
  const FaultEvent* stopped = Find(r, FaultEvent::Kind::kStopped);
  ASSERT_NE(stopped, nullptr);
  // Step 3, or step 2 when the kill failed the surviving replica's step 3 before its update
  // (the group's links fail at once).
  EXPECT_TRUE(stopped->step == 3 || stopped->step == 2) << stopped->step;
  Result<CheckpointEntry> newest = LatestGoodCheckpoint(ckpt, nullptr);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, stopped->step);
}

TEST(SupervisorTest, OptionsThatCannotWorkAreRefused) {
  ThreadLauncher launcher({});
  comm::HashStore store;
  EXPECT_EQ(Supervisor::Create({.ranks = 2}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Supervisor::Create({.ranks = 2, .shape = {.min_ranks = 1}, .launcher = &launcher})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(Supervisor::Create({.ranks = 2,
                                .heartbeat = {.period = Seconds(1), .timeout = Seconds(1)},
                                .store = &store,
                                .launcher = &launcher})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
}

TEST(FaultEventTest, TheFaultLogRecordsSayWhatHappened) {
  FaultEvent detected{.kind = FaultEvent::Kind::kDetected,
                      .worker = 2,
                      .reason = "killed by signal 9 (Killed)",
                      .generation = 1,
                      .ranks = 3};
  const nlohmann::json want_detected = {{"event", "detected"},
                                        {"worker", 2},
                                        {"reason", "killed by signal 9 (Killed)"},
                                        {"generation", 1},
                                        {"ranks", 3}};
  EXPECT_EQ(detected.ToJson(), want_detected);
  FaultEvent recovered{.kind = FaultEvent::Kind::kRecovered,
                       .generation = 1,
                       .ranks = 3,
                       .d = 3,
                       .source = "replica",
                       .step = 4,
                       .rebuild_s = 0.5,
                       .steps_lost = 0,
                       .duration_s = 0.75};
  const nlohmann::json want_recovered = {
      {"event", "recovered"}, {"generation", 1}, {"ranks", 3},       {"d", 3},
      {"source", "replica"},  {"step", 4},       {"rebuild_s", 0.5}, {"steps_lost", 0},
      {"duration_s", 0.75}};
  EXPECT_EQ(recovered.ToJson(), want_recovered);
  FaultEvent resized{.kind = FaultEvent::Kind::kResized,
                     .reason = "asked for 1 rank: retiring worker 1",
                     .generation = 2,
                     .ranks = 1};
  const nlohmann::json want_resized = {{"event", "resized"},
                                       {"ranks", 1},
                                       {"reason", "asked for 1 rank: retiring worker 1"},
                                       {"generation", 2}};
  EXPECT_EQ(resized.ToJson(), want_resized);
}

}  // namespace
}  // namespace kc::fault
