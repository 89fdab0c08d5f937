#include "api/job_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "api/quota_usage.h"
#include "tests/support/child_guard.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

JobRecord Job(std::string name, std::string owner = "ann") {
  return {.id = 0,
          .name = std::move(name),
          .owner = std::move(owner),
          .team = "vision",
          .spec = "model: gpt-tiny",
          .phase = JobPhase::kPending,
          .submitted_s = 0,
          .updated_s = 0,
          .reason = ""};
}

TEST(JobStoreTest, JobsMoveThroughTheirLifecycleAndPersist) {
  testing::TempDir dir("kc_jobs");
  const std::string path = dir.Path("kcd.db");
  int64_t id = 0;
  {
    Result<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().message();
    Result<JobRecord> j = (*store)->Submit(Job("train"), 100);
    ASSERT_TRUE(j.ok()) << j.status().message();
    id = j->id;
    EXPECT_EQ(j->phase, JobPhase::kPending);
    for (JobPhase p : {JobPhase::kApprovalRequired, JobPhase::kQueued, JobPhase::kRunning,
                       JobPhase::kPaused, JobPhase::kQueued, JobPhase::kRunning}) {
      ASSERT_TRUE((*store)->Transition(id, p, "step", 101).ok()) << JobPhaseName(p);
    }
    ASSERT_TRUE((*store)->Transition(id, JobPhase::kSucceeded, "done", 200).ok());
    Result<JobRecord> bad = (*store)->Transition(id, JobPhase::kRunning, "again", 201);
    EXPECT_EQ(bad.status().code(), ErrorCode::kFailedPrecondition);
    EXPECT_THAT(bad.status().message(), HasSubstr("cannot go from succeeded to running"));
    EXPECT_EQ((*store)->Transition(999, JobPhase::kQueued, "", 1).status().code(),
              ErrorCode::kNotFound);
    EXPECT_EQ((*store)->Submit(Job(""), 1).status().code(), ErrorCode::kInvalidArgument);
    ASSERT_TRUE((*store)->Submit(Job("other", "bob"), 300).ok());
  }
  Result<std::unique_ptr<JobStore>> again = JobStore::Open(path);
  ASSERT_TRUE(again.ok());
  Result<JobRecord> j = (*again)->Get(id);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->phase, JobPhase::kSucceeded);
  EXPECT_EQ(j->reason, "done");
  EXPECT_EQ(j->submitted_s, 100);
  EXPECT_EQ((*again)->List({.owner = "bob"})->size(), 1u);
  EXPECT_EQ((*again)->List({.phase = JobPhase::kPending})->size(), 1u);
  EXPECT_EQ((*again)->List({})->size(), 2u);
}

TEST(JobStoreTest, APendingReasonChangesNeitherPhaseNorHistory) {
  testing::TempDir dir("kc_jobs");
  Result<std::unique_ptr<JobStore>> store = JobStore::Open(dir.Path("kcd.db"));
  ASSERT_TRUE(store.ok()) << store.status().message();
  Result<JobRecord> j = (*store)->Submit(Job("train"), 100);
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*store)->Transition(j->id, JobPhase::kQueued, "queued", 101).ok());
  ASSERT_TRUE((*store)->SetReason(j->id, "pending: reason=Resources (pool all)", 102).ok());
  Result<JobRecord> after = (*store)->Get(j->id);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->phase, JobPhase::kQueued);
  EXPECT_EQ(after->reason, "pending: reason=Resources (pool all)");
  EXPECT_EQ((*store)->History(j->id)->size(), 2u);  // submitted, queued
  EXPECT_EQ((*store)->SetReason(999, "x", 103).code(), ErrorCode::kNotFound);
  ASSERT_TRUE((*store)->Transition(j->id, JobPhase::kCancelled, "by its owner", 104).ok());
  EXPECT_EQ((*store)->SetReason(j->id, "x", 105).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ((*store)->Get(j->id)->reason, "by its owner");
}

// A run's own events (it shrank, it grew back) join the history in the phase they happened in,
// and a running job's notes split none of its running time.
TEST(JobStoreTest, NotesJoinTheHistoryKeepingThePhaseAndTheRunningTime) {
  testing::TempDir dir("kc_jobs");
  Result<std::unique_ptr<JobStore>> store = JobStore::Open(dir.Path("kcd.db"));
  ASSERT_TRUE(store.ok()) << store.status().message();
  JobStore& s = **store;
  Result<JobRecord> j = s.Submit(Job("train"), 0);
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE(s.Transition(j->id, JobPhase::kQueued, "queued", 1).ok());
  ASSERT_TRUE(s.Transition(j->id, JobPhase::kRunning, "running", 10).ok());
  ASSERT_TRUE(s.Note(j->id, "shrank to 1 rank", 20).ok());
  ASSERT_TRUE(s.Note(j->id, "grew to 2 ranks", 30).ok());
  ASSERT_TRUE(s.Transition(j->id, JobPhase::kSucceeded, "done", 50).ok());
  Result<std::vector<JobEvent>> h = s.History(j->id);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 6u);
  EXPECT_EQ((*h)[3].phase, JobPhase::kRunning);
  EXPECT_EQ((*h)[3].reason, "shrank to 1 rank");
  EXPECT_EQ((*h)[4].reason, "grew to 2 ranks");
  EXPECT_DOUBLE_EQ(s.Get(j->id)->ran_s, 40);
  EXPECT_EQ(s.Note(j->id, "late", 60).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(s.Note(999, "x", 60).code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.Get(j->id)->reason, "done");
}

TEST(JobStoreTest, TheLifecycleAllowsOnlyItsTransitions) {
  using P = JobPhase;
  EXPECT_TRUE(AllowedTransition(P::kPending, P::kQueued));
  EXPECT_TRUE(AllowedTransition(P::kRunning, P::kQueued));  // devices lost: back to the queue
  EXPECT_TRUE(AllowedTransition(P::kPaused, P::kCancelled));
  EXPECT_FALSE(AllowedTransition(P::kPending, P::kRunning));
  EXPECT_TRUE(AllowedTransition(P::kQueued, P::kPaused));  // paused before it started
  EXPECT_FALSE(AllowedTransition(P::kQueued, P::kSucceeded));
  for (P t : {P::kSucceeded, P::kFailed, P::kCancelled}) {
    for (int to = 0; to < 8; ++to) EXPECT_FALSE(AllowedTransition(t, static_cast<P>(to)));
  }
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(JobPhaseFromName(JobPhaseName(static_cast<P>(p))), static_cast<P>(p));
  }
}

// kill -9 in the middle of submissions: every job the store acknowledged is there after it
// is reopened.
TEST(JobStoreTest, AcknowledgedJobsSurviveKillNine) {
  testing::TempDir dir("kc_jobs_kill");
  const std::string path = dir.Path("kcd.db");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    Result<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    if (!store.ok()) _exit(2);
    for (int64_t n = 0;; ++n) {
      Result<JobRecord> j = (*store)->Submit(Job("job-" + std::to_string(n)), 1);
      if (!j.ok()) _exit(3);
      const int64_t ack[2] = {j->id, n};
      if (write(fds[1], ack, sizeof(ack)) != sizeof(ack)) _exit(4);
    }
  }
  close(fds[1]);
  kc::testing::ChildGuard child(pid);
  std::map<int64_t, int64_t> acked;  // id -> n
  int64_t ack[2];
  while (acked.size() < 300 && read(fds[0], ack, sizeof(ack)) == sizeof(ack)) {
    acked[ack[0]] = ack[1];
  }
  child.KillAndReap();  // mid-submission
  close(fds[0]);
  ASSERT_EQ(acked.size(), 300u);
  Result<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().message();
  for (auto [id, n] : acked) {
    Result<JobRecord> j = (*store)->Get(id);
    ASSERT_TRUE(j.ok()) << "acknowledged job " << id << " lost: " << j.status().message();
    EXPECT_EQ(j->name, "job-" + std::to_string(n));
  }
  // The store still works after the crash.
  EXPECT_TRUE((*store)->Submit(Job("after"), 2).ok());
}

TEST(JobStoreTest, HistoryProgressRenamesAndLogsAreKept) {
  testing::TempDir dir("kc_jobs");
  Result<std::unique_ptr<JobStore>> store = JobStore::Open(dir.Path("kcd.db"));
  ASSERT_TRUE(store.ok()) << store.status().message();
  JobStore& s = **store;
  Result<JobRecord> j = s.Submit(Job("train"), 100);
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE(s.Transition(j->id, JobPhase::kQueued, "queued", 101).ok());
  ASSERT_TRUE(s.Transition(j->id, JobPhase::kRunning, "running on h1", 103).ok());
  // A refused transition leaves no trace in the history.
  EXPECT_FALSE(s.Transition(j->id, JobPhase::kApprovalRequired, "no", 104).ok());
  Result<std::vector<JobEvent>> h = s.History(j->id);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 3u);
  EXPECT_EQ((*h)[0].phase, JobPhase::kPending);
  EXPECT_EQ((*h)[2].reason, "running on h1");
  EXPECT_EQ((*h)[2].time_s, 103);
  EXPECT_EQ(s.History(999).status().code(), ErrorCode::kNotFound);

  EXPECT_EQ(s.Progress(j->id)->step, 0);
  ASSERT_TRUE(s.SetProgress(j->id, {.host = "h1", .step = 40, .checkpoint_step = 30}).ok());
  EXPECT_EQ(s.Progress(j->id)->checkpoint_step, 30);
  EXPECT_EQ(s.Progress(j->id)->host, "h1");

  Result<JobRecord> renamed = s.Modify(j->id, "train-2", 8.0, 105);
  ASSERT_TRUE(renamed.ok());
  EXPECT_EQ(s.Get(j->id)->name, "train-2");
  EXPECT_EQ(s.Get(j->id)->device_hours, 8.0);
  EXPECT_EQ(s.Modify(j->id, std::string(), std::nullopt, 106).status().code(),
            ErrorCode::kInvalidArgument);

  // Logs append and read back from any offset, in pieces.
  ASSERT_TRUE(s.AppendLog(j->id, "step 1\n").ok());
  ASSERT_TRUE(s.AppendLog(j->id, std::string("step 2\n\0bin", 11)).ok());
  EXPECT_EQ(s.ReadLog(j->id, 0, 1 << 20)->data, std::string("step 1\nstep 2\n\0bin", 18));
  EXPECT_EQ(s.ReadLog(j->id, 3, 6)->data, "p 1\nst");
  EXPECT_EQ(s.ReadLog(j->id, 18, 100)->data, "");

  ASSERT_TRUE(s.Transition(j->id, JobPhase::kCancelled, "bye", 107).ok());
  EXPECT_EQ(s.Modify(j->id, "late", std::nullopt, 108).status().code(),
            ErrorCode::kFailedPrecondition);
}

// The time a job ran, every run together, and what quotas count of it: the device-hours it
// asked for while it may still run, those it ran once it has ended.
TEST(JobStoreTest, ARunningTimeIsKeptAndEndedJobsCountTheHoursTheyRan) {
  testing::TempDir dir("kc_jobs");
  Result<std::unique_ptr<JobStore>> store = JobStore::Open(dir.Path("kcd.db"));
  ASSERT_TRUE(store.ok()) << store.status().message();
  JobStore& s = **store;
  JobRecord asked = Job("train");
  asked.devices = 2;
  asked.device_hours = 10;
  Result<JobRecord> j = s.Submit(asked, 0);
  ASSERT_TRUE(j.ok());
  const std::pair<JobPhase, double> moves[] = {{JobPhase::kQueued, 1},    {JobPhase::kRunning, 10},
                                               {JobPhase::kPaused, 40},   {JobPhase::kQueued, 50},
                                               {JobPhase::kRunning, 60},  {JobPhase::kQueued, 1000},
                                               {JobPhase::kRunning, 1800}};
  for (const auto& [phase, at] : moves) ASSERT_TRUE(s.Transition(j->id, phase, "", at).ok());
  // 30 s and 940 s; the run going on is counted from its next change.
  EXPECT_DOUBLE_EQ(s.Get(j->id)->ran_s, 970);
  EXPECT_DOUBLE_EQ(UsageOf(*s.List({}), QuotaSubject::kUser, "ann").device_hours, 10);
  ASSERT_TRUE(s.Transition(j->id, JobPhase::kCancelled, "", 2160).ok());
  EXPECT_DOUBLE_EQ(s.Get(j->id)->ran_s, 1330);
  EXPECT_DOUBLE_EQ(UsageOf(*s.List({}), QuotaSubject::kUser, "ann").device_hours,
                   2 * 1330.0 / 3600);
}

// A job that writes without end keeps only its newest output: the oldest goes whole pieces at
// a time, offsets stay those of everything it wrote, and a read from a dropped offset starts at
// the oldest kept and says so.
TEST(JobStoreTest, AJobsLogIsCutToItsNewestBytes) {
  testing::TempDir dir("kc_jobs");
  Result<std::unique_ptr<JobStore>> store =
      JobStore::Open(dir.Path("kcd.db"), {.max_log_bytes = 100});
  ASSERT_TRUE(store.ok()) << store.status().message();
  JobStore& s = **store;
  Result<JobRecord> j = s.Submit(Job("chatty"), 0);
  ASSERT_TRUE(j.ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(s.AppendLog(j->id, std::string(40, 'a' + i % 26)).ok());
  // 2000 bytes written; the last 100, and the piece that straddles them, kept.
  const LogSlice all = *s.ReadLog(j->id, 0, 1 << 20);
  EXPECT_EQ(all.from, 1880);
  EXPECT_EQ(all.data.size(), 120u);
  EXPECT_EQ(all.data.substr(80), std::string(40, 'a' + 49 % 26));
  const LogSlice tail = *s.ReadLog(j->id, 1990, 100);
  EXPECT_EQ(tail.from, 1990);
  EXPECT_EQ(tail.data, std::string(10, 'a' + 49 % 26));
}

// What the dispatcher reads every pass, and what a user may have waiting: the jobs that have
// not ended, without those that have.
TEST(JobStoreTest, TheActiveJobsAreListedAndCountedWithoutTheEndedOnes) {
  testing::TempDir dir("kc_jobs");
  Result<std::unique_ptr<JobStore>> store = JobStore::Open(dir.Path("kcd.db"));
  ASSERT_TRUE(store.ok());
  JobStore& s = **store;
  for (int i = 0; i < 5; ++i) {
    Result<JobRecord> j = s.Submit(Job("j" + std::to_string(i)), 0);
    ASSERT_TRUE(j.ok());
    if (i < 3) ASSERT_TRUE(s.Transition(j->id, JobPhase::kCancelled, "", 1).ok());
  }
  EXPECT_EQ(s.List({.active = true})->size(), 2u);
  EXPECT_EQ(s.List({})->size(), 5u);
  EXPECT_EQ(*s.CountActive("ann"), 2);
  EXPECT_EQ(*s.CountActive("bob"), 0);
}

// A job's run reports (kc diagnose's): in order, its newest kMaxJobReports steps kept and
// its events (a run's start) apart from them, an unknown job refused.
TEST(JobStoreTest, ReportsAreKeptInOrderTheNewestOnly) {
  testing::TempDir dir("kc_jobs");
  Result<std::unique_ptr<JobStore>> store = JobStore::Open(dir.Path("kcd.db"));
  ASSERT_TRUE(store.ok()) << store.status().message();
  JobStore& s = **store;
  Result<JobRecord> j = s.Submit(Job("reported"), 0);
  ASSERT_TRUE(j.ok());
  Result<JobRecord> other = s.Submit(Job("other"), 0);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(s.AppendReports(other->id, {{.bytes = std::string("x\0y", 3)}}).ok());
  ASSERT_TRUE(s.AppendReports(j->id, {{.bytes = "start", .event = true}}).ok());
  const int64_t n = JobStore::kMaxJobReports + 7;
  std::vector<JobReport> batch;
  for (int64_t i = 0; i < n; ++i) {
    batch.push_back({.bytes = std::to_string(i)});
    if (batch.size() == 1000 || i == n - 1) {
      ASSERT_TRUE(s.AppendReports(j->id, batch).ok());
      batch.clear();
    }
  }
  Result<std::vector<std::string>> kept = s.Reports(j->id);
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ(static_cast<int64_t>(kept->size()), JobStore::kMaxJobReports + 1);
  EXPECT_EQ(kept->front(), "start");  // the run's start outlasts its oldest steps
  EXPECT_EQ((*kept)[1], "7");
  EXPECT_EQ(kept->back(), std::to_string(n - 1));
  EXPECT_EQ(*s.Reports(other->id), std::vector<std::string>{std::string("x\0y", 3)});
  EXPECT_EQ(s.AppendReports(999, {{.bytes = "z"}}).code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.Reports(999).status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kc::api
