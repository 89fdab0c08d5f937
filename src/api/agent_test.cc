// The agent against a fake kcd on loopback: its heartbeats go on while a job's launch waits for
// an execution-time check kcd is slow to answer (the check, the launch and the heartbeat are not
// made under one lock), a stop for a run being launched is carried out once it is up, and the
// scheduler's resize of an elastic job reaches the file its kc train follows.
#include "api/agent.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/job_spec.h"
#include "api/train_job.h"
#include "kc/v1/agent.grpc.pb.h"
#include "kc/v1/permission.grpc.pb.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using Report = kc::v1::AgentJobReport;
using std::chrono::seconds;

// kcd's two services as an agent sees them: registration, heartbeats that hand out one start
// order, and permission checks held until the test lets them through.
class FakeKcd final : public kc::v1::AgentService::Service,
                      public kc::v1::PermissionService::Service {
 public:
  explicit FakeKcd(kc::v1::StartOrder start) : start_(std::move(start)) {}

  grpc::Status Register(grpc::ServerContext*, const kc::v1::RegisterAgentRequest*,
                        kc::v1::RegisterAgentResponse* out) override {
    out->set_heartbeat_period_s(0.02);
    out->set_check_period_s(0.02);
    out->set_lost_after_s(60);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const kc::v1::AgentHeartbeatRequest* req,
                         kc::v1::AgentHeartbeatResponse* out) override {
    std::lock_guard lock(mu_);
    ++heartbeats_;
    for (const Report& r : req->jobs()) {
      reports_.push_back(r);
      running_ = running_ || r.state() == Report::STATE_RUNNING;
    }
    if (!started_) {
      started_ = true;
      *out->add_start() = start_;
    } else if (!resizes_.empty() && running_) {
      for (const kc::v1::ResizeOrder& r : resizes_) *out->add_resize() = r;
      resizes_.clear();
    } else if (stop_ && !stop_sent_) {
      stop_sent_ = true;
      kc::v1::StopOrder* s = out->add_stop();
      s->set_job(start_.job());
      s->set_run(start_.run());
      s->set_reason("cancelled");
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Check(grpc::ServerContext*, const kc::v1::PermissionCheckRequest*,
                     kc::v1::PermissionCheckResponse* out) override {
    std::unique_lock lock(mu_);
    ++checks_waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return checks_open_; });
    --checks_waiting_;
    out->set_allowed(true);
    return grpc::Status::OK;
  }

  // Waits (at most a minute) until `done` holds under the fake's lock; whether it did.
  template <typename F>
  bool Await(F done) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::minutes(1), [&] { return done(); });
  }

  int Heartbeats() {
    std::lock_guard lock(mu_);
    return heartbeats_;
  }
  void OpenChecks() {
    std::lock_guard lock(mu_);
    checks_open_ = true;
    cv_.notify_all();
  }
  void OrderStop() {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  // Sent with the first heartbeat after the agent reported the job running.
  void OrderResize(kc::v1::ResizeOrder r) {
    std::lock_guard lock(mu_);
    resizes_.push_back(std::move(r));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int heartbeats_ = 0;
  int checks_waiting_ = 0;
  std::vector<Report> reports_;
  const kc::v1::StartOrder& start() const { return start_; }

 private:
  const kc::v1::StartOrder start_;
  bool started_ = false;
  bool checks_open_ = false;
  bool stop_ = false;
  bool stop_sent_ = false;
  bool running_ = false;
  std::vector<kc::v1::ResizeOrder> resizes_;
};

class AgentTest : public ::testing::Test {
 protected:
  explicit AgentTest(int ranks = 1, int min_devices = 0, std::string checkpoint_dir = "")
      : dir_("kc_agent") {
    JobSpec spec{.name = "x",
                 .model_yaml =
                     "name: m\nlayers: 1\nhidden: 64\nheads: 2\nvocab: 257\n"
                     "seq_len: 32\nbatch_per_rank: 4\n",
                 .ranks = ranks,
                 .min_devices = min_devices};
    spec.checkpoint_dir = std::move(checkpoint_dir);
    kc::v1::StartOrder start;
    start.set_job(7);
    start.set_run(1);
    *start.mutable_train_job() = ToTrainJob(spec);
    // A run of one rank, on device 0.
    start.mutable_assignment()->set_job(7);
    start.mutable_assignment()->set_run_id("job-7-run-1");
    start.mutable_assignment()->add_ranks()->set_device("h1/cpu0");
    start.add_devices(0);
    start.set_owner("ann");
    start.set_team("vision");
    kcd_ = std::make_unique<FakeKcd>(start);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(static_cast<kc::v1::AgentService::Service*>(kcd_.get()));
    b.RegisterService(static_cast<kc::v1::PermissionService::Service*>(kcd_.get()));
    server_ = b.BuildAndStart();
  }
  ~AgentTest() override {
    kcd_->OpenChecks();  // nothing stays blocked in the server
    server_->Shutdown(std::chrono::system_clock::now() + seconds(5));
  }

  // An agent whose jobs run `program` (given kc train's arguments, which it ignores).
  std::unique_ptr<Agent> StartAgent(const std::string& program = "/bin/true", int devices = 1,
                                    const std::string& metrics_listen = "") {
    Result<std::unique_ptr<Agent>> agent =
        Agent::Start({.kcd = {.server = "127.0.0.1:" + std::to_string(port_), .insecure = true},
                      .host = "h1",
                      .devices = devices,
                      .work_dir = dir_.Path("work"),
                      .kc_binary = program,
                      .stop_grace_s = 5,
                      .metrics_listen = metrics_listen});
    EXPECT_TRUE(agent.ok()) << agent.status();
    return agent.ok() ? *std::move(agent) : nullptr;
  }

  // Whether kcd heard that job 7 ended, with `state` and `exit_code`.
  bool HeardEnd(Report::State state, int exit_code = 0) {
    for (const Report& r : kcd_->reports_) {
      if (r.job() == 7 && r.state() == state && r.exit_code() == exit_code) return true;
    }
    return false;
  }

  testing::TempDir dir_;
  std::unique_ptr<FakeKcd> kcd_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(AgentTest, HeartbeatsGoOnWhileALaunchWaitsForItsExecutionCheck) {
  ASSERT_GT(port_, 0);
  std::unique_ptr<Agent> agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  // The start order went out; its launch now waits for kcd's answer to its first check.
  ASSERT_TRUE(kcd_->Await([&] { return kcd_->checks_waiting_ > 0; }));
  const int before = kcd_->Heartbeats();
  ASSERT_TRUE(kcd_->Await([&] { return kcd_->heartbeats_ >= before + 5; }))
      << "no heartbeat while a launch waited for its check";
  // Answered, the job starts (and, being /bin/true, ends at once); kcd hears of it.
  kcd_->OpenChecks();
  ASSERT_TRUE(kcd_->Await([&] { return HeardEnd(Report::STATE_EXITED); }));
}

TEST_F(AgentTest, AStopForARunBeingLaunchedIsCarriedOutOnceItIsUp) {
  ASSERT_GT(port_, 0);
  // A job that would run for a minute unless stopped.
  const std::string program = dir_.Write("job.sh", "#!/bin/sh\nexec sleep 60\n");
  ASSERT_EQ(chmod(program.c_str(), 0755), 0);
  std::unique_ptr<Agent> agent = StartAgent(program);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(kcd_->Await([&] { return kcd_->checks_waiting_ > 0; }));
  kcd_->OrderStop();
  const int before = kcd_->Heartbeats();
  ASSERT_TRUE(kcd_->Await([&] { return kcd_->heartbeats_ >= before + 3; }));
  kcd_->OpenChecks();
  // Up, it is stopped at once (SIGTERM), not left to run; kcd hears of its end.
  ASSERT_TRUE(kcd_->Await([&] { return HeardEnd(Report::STATE_EXITED, 128 + SIGTERM); })) << [&] {
    std::string seen;
    for (const Report& r : kcd_->reports_) seen += r.ShortDebugString() + "\n";
    return seen;
  }();
}

// An elastic job (min_devices 1 of 2) started on one device: kc train gets the range and a
// resize file holding its size; the scheduler's grow to two devices is written there.
class ElasticAgentTest : public AgentTest {
 protected:
  ElasticAgentTest() : AgentTest(/*ranks=*/2, /*min_devices=*/1) {}
};

TEST_F(ElasticAgentTest, AResizeOrderReachesTheFileTheRunFollows) {
  ASSERT_GT(port_, 0);
  const std::string args = dir_.Path("args");
  const std::string program =
      dir_.Write("job.sh", "#!/bin/sh\necho \"$@\" > " + args + "\nexec sleep 60\n");
  ASSERT_EQ(chmod(program.c_str(), 0755), 0);
  kcd_->OpenChecks();
  kc::v1::ResizeOrder grow;
  grow.set_job(7);
  grow.set_run(1);
  grow.add_devices(0);
  grow.add_devices(1);
  grow.set_reason("grown from 1 to 2 devices");
  kcd_->OrderResize(grow);
  std::unique_ptr<Agent> agent = StartAgent(program, /*devices=*/2);
  ASSERT_NE(agent, nullptr);
  const std::string size = dir_.Path("work/jobs/7/run-1/resize.json");
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  ASSERT_TRUE(kcd_->Await([&] {
    return nlohmann::json::parse(read(size), nullptr, false) == nlohmann::json{{"ranks", 2}} &&
           read(args).find('\n') != std::string::npos;
  })) << "the resize never reached "
      << size;
  const std::string argv = read(args);
  const std::string run_file = dir_.Path("work/jobs/7/run-1/job.binpb");
  EXPECT_NE(argv.find("--job " + run_file + " "), std::string::npos) << argv;
  EXPECT_NE(argv.find("--resize-file " + size), std::string::npos) << argv;
  // The run file holds the job as kcd sent it, its range included, and the run's assignment.
  Result<kc::v1::TrainRun> run = ReadTrainRun(run_file);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->job().SerializeAsString(), kcd_->start().train_job().SerializeAsString());
  EXPECT_EQ(run->assignment().SerializeAsString(), kcd_->start().assignment().SerializeAsString());
  EXPECT_EQ(run->job().elastic().min_devices(), 1);
  EXPECT_EQ(run->job().elastic().max_devices(), 2);
}

// A run's typed reports as `kc train --reports` appends them: a step, a fault, a checkpoint.
std::string WriteReports(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  kc::v1::TrainReport step;
  *step.mutable_step() = [] {
    kc::v1::StepReport s;
    s.set_step(5);
    s.set_loss(2.5);
    s.set_tokens_per_s(1000);
    s.set_step_s(0.02);
    s.set_compute_s(0.015);
    s.set_comm_exposed_s(0.002);
    for (double w : {0.003, 0.0, 0.0, 0.001}) s.add_lane_wait_s(w);
    for (int64_t b : {12, 0, 0, 2}) s.add_lane_backlog(b);
    s.set_retransmits(7);
    s.set_rtt_s(0.0005);
    return s;
  }();
  kc::v1::TrainReport fault;
  fault.mutable_fault()->set_event("detected");
  fault.mutable_fault()->set_worker(1);
  fault.mutable_fault()->set_reason("exit 9");
  kc::v1::TrainReport checkpoint;
  checkpoint.mutable_checkpoint()->set_step(4);
  for (const kc::v1::TrainReport& r : {step, fault, checkpoint}) AppendReport(f, r);
  std::fclose(f);
  return path;
}

// A start order whose job names a path out of the agent's roots (kcd checked it at
// submission; a kcd that did not, or one impersonated, still cannot make the agent write there).
class EscapingAgentTest : public AgentTest {
 protected:
  EscapingAgentTest() : AgentTest(1, 0, "../../outside") {}
};

TEST_F(EscapingAgentTest, AJobPathOutOfTheAgentsRootsIsNotStarted) {
  ASSERT_GT(port_, 0);
  const std::string ran = dir_.Path("ran");
  const std::string program = dir_.Write("job.sh", "#!/bin/sh\ntouch " + ran + "\n");
  ASSERT_EQ(chmod(program.c_str(), 0755), 0);
  kcd_->OpenChecks();
  std::unique_ptr<Agent> agent = StartAgent(program);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(kcd_->Await([&] {
    for (const Report& r : kcd_->reports_) {
      if (r.state() == Report::STATE_FAILED_TO_START &&
          r.reason().find("checkpoint_dir") != std::string::npos) {
        return true;
      }
    }
    return false;
  }));
  EXPECT_FALSE(std::filesystem::exists(ran));
}

// The agent's metrics page has each running job's last step record, scraped over HTTP; kcd
// hears its faults and its checkpoint's step, all from the run's typed reports.
TEST_F(AgentTest, ItsMetricsGiveEachRunsLastStep) {
  ASSERT_GT(port_, 0);
  const std::string reports = WriteReports(dir_.Path("reports.binpb"));
  const std::string program =
      dir_.Write("job.sh",
                 "#!/bin/sh\n"
                 "while [ $# -gt 0 ]; do if [ \"$1\" = --reports ]; then to=$2; fi; shift; done\n"
                 "cp " +
                     reports +
                     " \"$to\"\n"
                     "exec sleep 60\n");
  ASSERT_EQ(chmod(program.c_str(), 0755), 0);
  kcd_->OpenChecks();
  std::unique_ptr<Agent> agent = StartAgent(program, 1, "127.0.0.1:0");
  ASSERT_NE(agent, nullptr);
  ASSERT_GT(agent->metrics_port(), 0);
  std::string page;
  ASSERT_TRUE(kcd_->Await([&] {
    httplib::Result r = httplib::Client("127.0.0.1", agent->metrics_port()).Get("/metrics");
    page = r ? r->body : "";
    return page.find("kc_run_step{job=\"7\",name=\"x\",host=\"h1\"} 5\n") != std::string::npos;
  })) << page;
  EXPECT_NE(page.find("kc_agent_jobs_running{host=\"h1\"} 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("kc_run_tokens_per_second{job=\"7\",name=\"x\",host=\"h1\"} 1000\n"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("kc_run_step_seconds{job=\"7\",name=\"x\",host=\"h1\"} 0.02\n"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("kc_run_comm_exposed_seconds{job=\"7\",name=\"x\",host=\"h1\"} 0.002\n"),
            std::string::npos)
      << page;
  EXPECT_NE(
      page.find("kc_run_lane_wait_seconds{job=\"7\",name=\"x\",host=\"h1\",lane=\"gradient\"} "
                "0.003\n"),
      std::string::npos)
      << page;
  EXPECT_NE(page.find("kc_run_lane_backlog_chunks{job=\"7\",name=\"x\",host=\"h1\",lane="
                      "\"telemetry\"} 2\n"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("kc_run_tcp_retransmits{job=\"7\",name=\"x\",host=\"h1\"} 7\n"),
            std::string::npos)
      << page;
  ASSERT_TRUE(kcd_->Await([&] {
    bool fault = false, checkpoint = false;
    for (const Report& r : kcd_->reports_) {
      for (const kc::v1::TrainReport& t : r.reports()) {
        const kc::v1::FaultReport& f = t.fault();
        fault = fault || (f.event() == "detected" && f.worker() == 1 && f.reason() == "exit 9");
      }
      checkpoint = checkpoint || r.checkpoint_step() == 4;
    }
    return fault && checkpoint;
  })) << "kcd never heard of the run's fault and checkpoint";
}

}  // namespace
}  // namespace kc::api
