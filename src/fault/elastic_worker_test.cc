// ElasticWorker on its own: what a rank reports, a stop, and what it refuses. Several workers
// under a supervisor: supervisor_test.cc.
#include "fault/elastic_worker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <variant>

#include "parallel/training_test_support.h"

namespace kc::fault {
namespace {

using parallel::testing::OneCore;
using parallel::testing::TinyCorpus;
using parallel::testing::TinyModel;

class Collect final : public WorkerObserver {
 public:
  void OnReport(const Report& report) override { reports.push_back(report); }
  template <typename T>
  std::vector<T> All() const {
    std::vector<T> out;
    for (const Report& r : reports) {
      if (const T* x = std::get_if<T>(&r)) out.push_back(*x);
    }
    return out;
  }
  std::vector<Report> reports;
};

struct OneWorker {
  const TinyCorpus corpus;
  const kc::testing::TempDir dir{"kc_elastic_worker"};
  std::unique_ptr<hal::ComputeDevice> device = OneCore(0);
  Collect observer;

  ElasticWorkerOptions Options(int64_t steps) {
    ElasticWorkerOptions o;
    o.shape = {.global_batch = 4, .micro_batch_size = 2, .micro_batches = 2};
    o.trainer.spec = TinyModel();
    o.trainer.data = corpus.train();
    o.trainer.validation = corpus.val();
    o.trainer.total_steps = steps;
    o.trainer.device = device.get();
    o.runner.steps = steps;
    o.runner.checkpoint.dir = dir.Path("ckpt");
    o.runner.checkpoint_every = 2;
    o.runner.model = ModelFingerprint(o.trainer.spec);
    o.eval_every = 2;
    o.eval_batches = 1;
    o.observer = &observer;
    return o;
  }
};

TEST(ElasticWorkerTest, AWorkerAloneReportsItsStartStepsEvaluationsAndCheckpoints) {
  OneWorker w;
  ElasticWorker worker(w.Options(4));
  Result<int> rank = worker.Run();
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 0);
  ASSERT_FALSE(w.observer.reports.empty());
  EXPECT_TRUE(std::holds_alternative<StartReport>(w.observer.reports.front()));
  const auto steps = w.observer.All<StepReport>();
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i].step, static_cast<int64_t>(i) + 1);
  EXPECT_EQ(steps[0].tokens, 4 * 16);
  const auto val = w.observer.All<EvaluationReport>();
  ASSERT_EQ(val.size(), 2u);
  EXPECT_EQ(val[0].step, 2);
  EXPECT_EQ(val[1].step, 4);
  const auto checkpoints = w.observer.All<CheckpointReport>();
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints.back().step, 4);
  // Every report survives the JSON of the metrics file and the report pipe.
  for (const Report& r : w.observer.reports) {
    Result<Report> back = ReportFromJson(ReportToJson(r));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(ReportToJson(*back), ReportToJson(r));
  }
}

TEST(ElasticWorkerTest, AStopRequestedBeforeTheRunStopsItAfterItsFirstStepWithACheckpoint) {
  OneWorker w;
  std::atomic<bool> stop{true};
  ElasticWorkerOptions o = w.Options(4);
  o.stop_requested = &stop;
  ElasticWorker worker(o);
  Result<int> rank = worker.Run();
  EXPECT_EQ(rank.status().code(), ErrorCode::kCancelled);
  ASSERT_EQ(w.observer.All<StepReport>().size(), 1u);
  ASSERT_FALSE(w.observer.All<CheckpointReport>().empty());
  EXPECT_EQ(w.observer.All<CheckpointReport>().back().step, 1);
}

// checkpoint_every: auto on a cluster: the scheduler's advice is asked at every re-estimate,
// so a change of it is followed, and each interval records the advice it came from.
TEST(ElasticWorkerTest, AnAdvisedIntervalFollowsTheAdviceAndSaysWhoseItIs) {
  OneWorker w;
  ElasticWorkerOptions o = w.Options(6);
  o.runner.checkpoint_every = 0;
  int asked = 0;
  // Mean times between interruptions so short that every interval is one step.
  o.runner.advised_mtbf = [&asked] {
    ++asked;
    return RunnerOptions::AdvisedMtbf{.mtbf_s = asked == 1 ? 1e-9 : 2e-9,
                                      .source = "advised: pool cpu, class preemptible"};
  };
  ElasticWorker worker(o);
  Result<int> rank = worker.Run();
  ASSERT_TRUE(rank.ok()) << rank.status();
  const auto intervals = w.observer.All<IntervalReport>();
  ASSERT_GE(intervals.size(), 2u);
  EXPECT_EQ(static_cast<int>(intervals.size()), asked);
  EXPECT_EQ(intervals.front().mtbf_s, 1e-9);
  EXPECT_EQ(intervals.back().mtbf_s, 2e-9);
  for (const IntervalReport& i : intervals) {
    EXPECT_EQ(i.source, "advised: pool cpu, class preemptible");
    EXPECT_EQ(i.every_steps, 1);
  }
  // A checkpoint after every step.
  EXPECT_EQ(w.observer.All<CheckpointReport>().size(), 6u);
}

TEST(ElasticWorkerTest, AnMtbfAndAnAdviceTogetherAreRefused) {
  OneWorker w;
  ElasticWorkerOptions o = w.Options(2);
  o.runner.mtbf_s = 3600;
  o.runner.advised_mtbf = [] { return RunnerOptions::AdvisedMtbf{.mtbf_s = 60}; };
  EXPECT_EQ(ElasticWorker(o).Run().status().code(), ErrorCode::kInvalidArgument);
}

TEST(ElasticWorkerTest, SeveralRanksWithoutAStoreOrAReplacementOfNoElasticRunAreRefused) {
  OneWorker w;
  ElasticWorkerOptions o = w.Options(2);
  o.ranks = 2;
  EXPECT_EQ(ElasticWorker(o).Run().status().code(), ErrorCode::kInvalidArgument);
  o.ranks = 1;
  o.join = true;
  EXPECT_EQ(ElasticWorker(o).Run().status().code(), ErrorCode::kInvalidArgument);
}

TEST(ReportTest, AnUnknownOrIncompleteRecordIsNoReport) {
  EXPECT_EQ(ReportFromJson({{"type", "nonsense"}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ReportFromJson({{"type", "step"}, {"step", 3}}).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(ReportFromJson(nlohmann::json::array()).status().code(), ErrorCode::kInvalidArgument);
}

// The supervisor's record of each rank's compute time reads back as it was written, and one
// whose lists differ in length is none.
TEST(ReportTest, ARanksRecordReadsBackAndMismatchedListsAreRefused) {
  const RanksReport r{.step = 40, .workers = {0, 2, 1}, .compute_ms = {1.5, 9.25, 1.75}};
  Result<Report> back = ReportFromJson(ReportToJson(r));
  ASSERT_TRUE(back.ok()) << back.status();
  const auto* ranks = std::get_if<RanksReport>(&*back);
  ASSERT_NE(ranks, nullptr);
  EXPECT_EQ(ranks->step, 40);
  EXPECT_EQ(ranks->workers, r.workers);
  EXPECT_EQ(ranks->compute_ms, r.compute_ms);
  nlohmann::json bad = ReportToJson(r);
  bad["compute_ms"] = {1.0};
  EXPECT_EQ(ReportFromJson(bad).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::fault
