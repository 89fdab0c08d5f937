// `kc train --job`, as kc agent runs a job kcd started: the run file (the typed job and the
// run's assignment) sets what the flags would, every rank reads it, the run's typed reports
// say each step and checkpoint, and a run file beside the flags it sets is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/train_job.h"
#include "parallel/plan.h"
#include "tests/support/inventories.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

namespace fs = std::filesystem;
using kc::testing::KcRun;
using ::testing::HasSubstr;

KcRun Kc(const std::string& args) { return kc::testing::RunKc(KC_BINARY, args); }

class TrainRunFileTest : public ::testing::Test {
 protected:
  TrainRunFileTest() : dir_("kc_train_run_file") {
    EXPECT_EQ(kc::testing::PrepareMicroData(KC_BINARY, dir_).exit_code, 0);
    model_ = dir_.Write("micro.yaml", kc::testing::kMicroModel);
  }
  std::string data() const { return " --data " + dir_.Path("fortunes/manifest.json"); }

  // A 2-rank run of the micro model: 6 steps of 8 sequences, plan d=2 with two micro-batches,
  // a checkpoint every 3 steps.
  kc::v1::TrainRun Run() const {
    kc::v1::TrainRun run;
    kc::v1::TrainJob* job = run.mutable_job();
    job->set_name("typed");
    job->set_model_yaml(kc::testing::kMicroModel);
    job->set_steps(6);
    job->mutable_elastic()->set_min_devices(2);
    job->mutable_elastic()->set_max_devices(2);
    job->mutable_checkpoint()->set_every_steps(3);
    job->mutable_checkpoint()->set_memory_copy_every(4);
    job->set_grad_wire("bf16");
    kc::v1::RunAssignment* as = run.mutable_assignment();
    as->set_run_id("job-1-run-1");
    as->set_global_batch(8);
    Result<parallel::ParallelPlan> plan =
        parallel::ParsePlanFlag("d=2,micro_batch_size=2,micro_batches=2");
    EXPECT_TRUE(plan.ok());
    *as->mutable_plan() = ToTrainPlan(plan.ok() ? *plan : parallel::ParallelPlan{});
    as->add_ranks()->set_rank(0);
    as->add_ranks()->set_rank(1);
    return run;
  }

  // The step and checkpoint reports appended to `path` past *offset.
  static void ReadReports(const std::string& path, int64_t* offset, std::vector<int64_t>* steps,
                          std::vector<int64_t>* checkpoints) {
    ASSERT_TRUE(ReadNewReports(path, offset, [&](const kc::v1::TrainReport& r) {
                  EXPECT_EQ(r.run_id(), "job-1-run-1");
                  if (r.has_step()) steps->push_back(r.step().step());
                  if (r.has_checkpoint()) checkpoints->push_back(r.checkpoint().step());
                }).ok());
  }

  // The losses and the header of a run's metrics file.
  static std::vector<double> Losses(const std::string& metrics, nlohmann::json* header) {
    std::vector<double> losses;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json r = nlohmann::json::parse(line);
      if (r["type"] == "run") *header = r;
      if (r["type"] == "step") losses.push_back(r["loss"].get<double>());
    }
    return losses;
  }

  kc::testing::TempDir dir_;
  std::string model_;
};

TEST_F(TrainRunFileTest, ARunFileTrainsAsItsFlagsWouldAndItsReportsAreTyped) {
  const std::string file = dir_.Path("typed/job.binpb");
  fs::create_directories(dir_.Path("typed"));
  ASSERT_TRUE(WriteTrainRun(file, Run()).ok());
  const std::string reports = dir_.Path("typed/reports.binpb");
  const std::string run = "train --job " + file + data() + " --out " + dir_.Path("typed") +
                          " --reports " + reports + " --checkpoint-dir " + dir_.Path("typed/ckpt") +
                          " --progress none";
  const KcRun typed = Kc(run);
  ASSERT_EQ(typed.exit_code, 0) << typed.err;
  const KcRun flags = Kc("train " + model_ + data() + " --out " + dir_.Path("flags") +
                         " --ranks 2 --steps 6 --global-batch 8 --plan "
                         "d=2,micro_batch_size=2,micro_batches=2 --progress none");
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  nlohmann::json header, flags_header;
  const std::vector<double> losses = Losses(dir_.Path("typed/metrics.jsonl"), &header);
  EXPECT_EQ(header["ranks"], 2);
  EXPECT_EQ(header["global_batch"], 8);
  EXPECT_THAT(header["plan"].get<std::string>(), HasSubstr("micro_batches=2"));
  EXPECT_EQ(header["memory_copy_every"], 4);
  EXPECT_EQ(header["grad_wire"], "bf16");
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_EQ(losses, Losses(dir_.Path("flags/metrics.jsonl"), &flags_header));
  EXPECT_EQ(flags_header["memory_copy_every"], 0);  // auto: a run that is not elastic

  std::vector<int64_t> steps, checkpoints;
  int64_t offset = 0;
  ReadReports(reports, &offset, &steps, &checkpoints);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{3, 6}));

  // Again on the same checkpoints (a requeue after the last one): every step is there
  // already, and the reports appended say so.
  const KcRun again = Kc(run);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  steps.clear();
  checkpoints.clear();
  ReadReports(reports, &offset, &steps, &checkpoints);
  EXPECT_EQ(steps, (std::vector<int64_t>{6}));
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{6}));
}

TEST_F(TrainRunFileTest, ARunFileBesideTheFlagsItSetsIsRefused) {
  KcRun r = Kc("train --progress none" + data());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("expected a model file (kc train MODEL.yaml) or --job RUN_FILE"));
  const std::string junk = dir_.Write("not-a-run.binpb", "name: x\n");
  r = Kc("train --progress none --job " + junk + data());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(junk + ": not a run file"));
  r = Kc("train --progress none --job " + junk + " --plan d=2 --steps 3" + data());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--plan, --steps: set by the run file --job " + junk));
  r = Kc("train " + model_ + " --progress none --job " + junk + data());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("the model file: set by the run file"));
  // A command job's run file: kc run runs those.
  kc::v1::TrainRun command = Run();
  command.mutable_job()->clear_model_yaml();
  command.mutable_job()->add_command("python3");
  const std::string file = dir_.Path("command.binpb");
  ASSERT_TRUE(WriteTrainRun(file, command).ok());
  r = Kc("train --progress none --job " + file + data());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("a command job (kc run runs it)"));
}

}  // namespace
}  // namespace kc::api
