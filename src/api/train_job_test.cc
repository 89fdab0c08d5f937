// The typed job: its conversions, kcd's checks of what arrives typed, the stored form (and the
// JSON spec stored before it), run files and the reports stream.
#include "api/train_job.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

const char kModel[] =
    "name: m\nlayers: 2\nhidden: 64\nheads: 2\nvocab: 257\nseq_len: 32\nbatch_per_rank: 4\n";

JobSpec ElasticJob() {
  JobSpec s{.name = "tiny", .team = "vision", .job_class = "preemptible", .model_yaml = kModel};
  s.ranks = 4;
  s.min_devices = 2;
  s.plan =
      "t=1 p=2 d=2 micro_batch_size=2 micro_batches=4 schedule=1f1b v=1 recompute=false "
      "zero_stage=0";
  s.steps = 50;
  s.global_batch = 16;
  s.checkpoint_auto = true;
  s.checkpoint_keep = 2;
  s.checkpoint_compress = true;
  s.memory_copy_every = 5;
  s.grad_wire = "bf16";
  s.heartbeat_period_s = 0.5;
  s.heartbeat_timeout_s = 5;
  s.max_restarts = 5;
  s.restart_backoff_s = 2;
  s.data = "sets/fortunes/manifest.json";
  s.checkpoint_dir = "ckpt/tiny";
  return s;
}

TEST(TrainJobTest, ASpecAndItsTypedJobCarryTheSameJob) {
  const JobSpec s = ElasticJob();
  const kc::v1::TrainJob j = ToTrainJob(s);
  EXPECT_EQ(j.elastic().min_devices(), 2);
  EXPECT_EQ(j.elastic().max_devices(), 4);
  EXPECT_TRUE(j.elastic().elastic());
  EXPECT_TRUE(j.checkpoint().scheduler_advised());
  EXPECT_EQ(j.plan().p(), 2);
  EXPECT_EQ(j.plan().schedule(), "1f1b");
  EXPECT_EQ(j.checkpoint().memory_copy_every(), 5);
  EXPECT_EQ(j.grad_wire(), "bf16");
  // Back, and again: nothing lost.
  EXPECT_EQ(JobSpecText(JobSpecOf(j)), JobSpecText(s));
  EXPECT_EQ(ToTrainJob(JobSpecOf(j)).SerializeAsString(), j.SerializeAsString());

  JobSpec command{.name = "ddp", .command = {"python3", "train.py"}, .workdir = "w"};
  command.env = {{"A", "1"}, {"B", "2"}};
  command.ranks = 2;
  const JobSpec back = JobSpecOf(ToTrainJob(command));
  EXPECT_EQ(back.command, command.command);
  EXPECT_EQ(back.env, command.env);
  EXPECT_EQ(back.ranks, 2);
  EXPECT_EQ(back.min_devices, 0);
}

TEST(TrainJobTest, WhatArrivesTypedIsCheckedAsAJobFileIs) {
  Result<JobSpec> ok = CheckedJobSpec(ToTrainJob(ElasticJob()));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(JobSpecText(*ok), JobSpecText(ElasticJob()));

  struct Case {
    std::function<void(kc::v1::TrainJob*)> change;
    std::string key;
  };
  const std::vector<Case> cases = {
      {[](kc::v1::TrainJob* j) { j->mutable_elastic()->set_min_devices(5); }, "min_devices"},
      {[](kc::v1::TrainJob* j) { j->set_steps(0); }, "steps"},
      {[](kc::v1::TrainJob* j) { j->set_data("../../etc/passwd"); }, "data"},
      {[](kc::v1::TrainJob* j) { j->mutable_checkpoint()->set_dir("/abs"); }, "checkpoint_dir"},
      {[](kc::v1::TrainJob* j) { j->set_model_yaml("name: m\n"); }, "model_yaml"},
      {[](kc::v1::TrainJob* j) { j->mutable_plan()->set_schedule("round-robin"); }, "schedule"},
      {[](kc::v1::TrainJob* j) { j->mutable_plan()->set_t(3); }, "plan"},
      {[](kc::v1::TrainJob* j) { j->set_job_class("urgent"); }, "class"},
      {[](kc::v1::TrainJob* j) { j->mutable_heartbeat()->set_timeout_s(0.6); },
       "heartbeat_timeout"},
      {[](kc::v1::TrainJob* j) { j->add_command("python3"); }, "model_yaml"},
      {[](kc::v1::TrainJob* j) {
         j->add_env()->set_name("RANK");
         j->clear_model_yaml();
         j->clear_plan();
         j->clear_data();
         j->set_steps(0);
         j->set_global_batch(0);
         j->add_command("python3");
       },
       "RANK"},
  };
  for (const Case& c : cases) {
    kc::v1::TrainJob j = ToTrainJob(ElasticJob());
    c.change(&j);
    Result<JobSpec> r = CheckedJobSpec(j);
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(c.key), std::string::npos) << r.status();
  }
}

TEST(TrainJobTest, KcdReadsWhatItStoredBeforeAndSince) {
  const JobSpec s = ElasticJob();
  const std::string stored = StoredJobText(s);
  EXPECT_NE(stored.find("\"elastic\""), std::string::npos) << stored;
  Result<JobSpec> now = ReadStoredJob(stored, "job 1");
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(JobSpecText(*now), JobSpecText(s));
  // The JSON spec kcd stored before the typed job.
  Result<JobSpec> before = ReadStoredJob(JobSpecText(s), "job 1");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(JobSpecText(*before), JobSpecText(s));
  Result<JobSpec> bad = ReadStoredJob("{\"nme\": 1}", "job 1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("job 1"), std::string::npos) << bad.status();
}

TEST(TrainJobTest, CommLimitsKeepTheirValuesAndRefuseBadLanes) {
  comm::LaneOptions lanes;
  lanes.chunk_bytes = 65536;
  lanes.priority = {comm::Lane::kActivation, comm::Lane::kGradient, comm::Lane::kControl,
                    comm::Lane::kTelemetry};
  const comm::RateLimit limit{.ops_per_second = 2000, .bytes_per_second = 2.5e9};
  kc::v1::CommLimits typed = ToCommLimits(limit, lanes);
  comm::RateLimit limit_back;
  comm::LaneOptions lanes_back;
  ASSERT_TRUE(FromCommLimits(typed, &limit_back, &lanes_back).ok());
  EXPECT_EQ(limit_back.ops_per_second, 2000);
  EXPECT_EQ(limit_back.bytes_per_second, 2.5e9);
  EXPECT_EQ(lanes_back.chunk_bytes, 65536);
  EXPECT_EQ(lanes_back.priority, lanes.priority);

  typed.set_lane_priority(0, "bulk");
  Status s = FromCommLimits(typed, &limit_back, &lanes_back);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bulk"), std::string::npos) << s;
  typed = ToCommLimits({.ops_per_second = 0}, lanes);
  EXPECT_EQ(FromCommLimits(typed, &limit_back, &lanes_back).code(), ErrorCode::kInvalidArgument);
}

TEST(TrainJobTest, ARunFileReadsBackAndAnythingElseIsNamed) {
  testing::TempDir dir("kc_train_job");
  kc::v1::TrainRun run;
  *run.mutable_job() = ToTrainJob(ElasticJob());
  run.mutable_assignment()->set_run_id("job-3-run-1");
  *run.mutable_assignment()->mutable_plan() = run.job().plan();
  const std::string path = dir.Path("job.binpb");
  ASSERT_TRUE(WriteTrainRun(path, run).ok());
  Result<kc::v1::TrainRun> back = ReadTrainRun(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), run.SerializeAsString());

  const std::string junk = dir.Write("junk", "name: not a run\n");
  Result<kc::v1::TrainRun> bad = ReadTrainRun(junk);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(junk), std::string::npos) << bad.status();
  EXPECT_EQ(ReadTrainRun(dir.Path("missing")).status().code(), ErrorCode::kNotFound);
}

kc::v1::TrainReport Step(int64_t step) {
  kc::v1::TrainReport r;
  r.mutable_step()->set_step(step);
  r.mutable_step()->set_loss(1.0 / static_cast<double>(step));
  return r;
}

TEST(TrainJobTest, AReaderTakesWholeReportsInOrderAndWaitsForAHalfWrittenOne) {
  testing::TempDir dir("kc_train_job");
  const std::string path = dir.Path("reports.binpb");
  std::vector<int64_t> seen;
  auto each = [&](const kc::v1::TrainReport& r) { seen.push_back(r.step().step()); };
  int64_t offset = 0;
  ASSERT_TRUE(ReadNewReports(path, &offset, each).ok());  // none yet
  EXPECT_EQ(offset, 0);

  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  kc::v1::TrainReport fault;
  fault.mutable_fault()->set_event("detected");
  fault.mutable_fault()->set_reason(std::string(300, 'x'));  // a length of two varint bytes
  for (const kc::v1::TrainReport& r : {Step(1), fault, Step(2)}) ASSERT_TRUE(AppendReport(f, r));
  std::fclose(f);
  std::string whole;
  {
    std::ifstream in(path, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Every cut of the file: the reports before it, none past it, the rest at the next read.
  for (size_t cut = 0; cut <= whole.size(); ++cut) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << whole.substr(0, cut);
    }
    seen.clear();
    offset = 0;
    ASSERT_TRUE(ReadNewReports(path, &offset, each).ok()) << cut;
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << whole;
    }
    ASSERT_TRUE(ReadNewReports(path, &offset, each).ok()) << cut;
    EXPECT_EQ(seen, (std::vector<int64_t>{1, 0, 2})) << "cut at " << cut;
    EXPECT_EQ(offset, static_cast<int64_t>(whole.size()));
  }
  // Bytes that are no report: named, and nothing more read.
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << std::string(12, '\xff');
  }
  offset = static_cast<int64_t>(whole.size());
  const Status s = ReadNewReports(path, &offset, each);
  EXPECT_EQ(s.code(), ErrorCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_EQ(offset, static_cast<int64_t>(whole.size()));
}

TEST(TrainJobTest, AFaultEventBecomesItsReport) {
  fault::FaultEvent e{.kind = fault::FaultEvent::Kind::kRecovered};
  e.generation = 2;
  e.ranks = 3;
  e.d = 3;
  e.source = "replica";
  e.step = 17;
  e.steps_lost = 0;
  e.duration_s = 1.5;
  const kc::v1::FaultReport r = ToFaultReport(e);
  EXPECT_EQ(r.event(), "recovered");
  EXPECT_EQ(r.generation(), 2);
  EXPECT_EQ(r.ranks(), 3);
  EXPECT_EQ(r.source(), "replica");
  EXPECT_TRUE(r.has_steps_lost());
  EXPECT_EQ(r.duration_s(), 1.5);
  EXPECT_FALSE(ToFaultReport({.kind = fault::FaultEvent::Kind::kDetected}).has_steps_lost());
  const std::string line = FaultReportJson(r);
  EXPECT_NE(line.find("\"event\":\"recovered\""), std::string::npos) << line;
}

}  // namespace
}  // namespace kc::api
