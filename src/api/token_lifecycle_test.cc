// Tokens through their life, against kcd in process with this test playing host h1's agent: an
// agent's identity reaches the agent service alone, for its host alone; a run's token reaches
// the execution-time check alone and dies with its run; a user whose tokens were revoked starts
// nothing it queued before.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <thread>

#include "api/control_plane.h"
#include "api/internal/digest.h"
#include "api/job_spec.h"
#include "api/tokens.h"
#include "kc/v1/agent.grpc.pb.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/permission.grpc.pb.h"
#include "tests/support/inventories.h"
#include "tests/support/kcd_in_process.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

constexpr char kRoles[] = R"(
cluster: c
users:
  - {name: root, role: system_admin}
  - {name: ann, role: submitter}
)";

class TokenLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<InitResult> init =
        InitCluster({.dir = dir_.path(),
                     .admin = "root",
                     .inventory_path = dir_.Write("inv.yaml", kc::testing::kTwoCpuHosts)});
    ASSERT_TRUE(init.ok()) << init.status().message();
    dir_.Write("roles.yaml", kRoles);
    tokens_ = std::move(*TokenStore::Open(dir_.Path("kcd.db")));
    const double now = internal::WallSeconds();
    root_ = init->admin_token;
    ann_ = tokens_->Issue("ann", 3600, now)->token;
    agent_ = tokens_->Issue("h1", 3600, now, TokenKind::kAgent)->token;
    Result<kc::testing::KcdInProcess> kcd = kc::testing::StartKcdInProcess({.dir = dir_.path()});
    ASSERT_TRUE(kcd.ok()) << kcd.status().message();
    kcd_ = std::move(kcd->kcd);
    channel_ = kcd->channel;
  }
  void TearDown() override {
    if (kcd_ != nullptr) kcd_->Shutdown();
  }

  template <typename Service, typename Req, typename Resp, typename Method>
  grpc::Status As(const std::string& token, Method method, const Req& req, Resp* resp) {
    auto stub = Service::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ((*stub).*method)(&ctx, req, resp);
  }
  grpc::Status Register(const std::string& token, const std::string& host) {
    kc::v1::RegisterAgentRequest r;
    r.set_host(host);
    r.set_devices(2);
    kc::v1::RegisterAgentResponse out;
    return As<kc::v1::AgentService>(token, &kc::v1::AgentService::Stub::Register, r, &out);
  }
  kc::v1::AgentHeartbeatResponse Heartbeat(const kc::v1::AgentHeartbeatRequest& r) {
    kc::v1::AgentHeartbeatResponse out;
    const grpc::Status s =
        As<kc::v1::AgentService>(agent_, &kc::v1::AgentService::Stub::Heartbeat, r, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }
  int64_t Submit(const std::string& token) {
    JobSpec spec{.name = "j", .model_yaml = kc::testing::kMicroModel, .steps = 5};
    kc::v1::SubmitJobRequest r;
    r.set_name("j");
    r.set_spec(JobSpecText(spec));
    r.set_devices(1);
    r.set_expected_hours(1);
    kc::v1::JobInfo out;
    const grpc::Status s =
        As<kc::v1::JobService>(token, &kc::v1::JobService::Stub::Submit, r, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out.id();
  }
  kc::v1::JobInfo Job(int64_t id) {
    kc::v1::GetJobRequest r;
    r.set_id(id);
    kc::v1::JobInfo out;
    EXPECT_TRUE(As<kc::v1::JobService>(root_, &kc::v1::JobService::Stub::Get, r, &out).ok());
    return out;
  }
  grpc::Status CheckDeviceUse(const std::string& token) {
    kc::v1::PermissionCheckRequest r;
    r.set_action("device.use");
    r.mutable_resource()->set_kind("device");
    r.mutable_resource()->set_owner("ann");
    kc::v1::PermissionCheckResponse out;
    return As<kc::v1::PermissionService>(token, &kc::v1::PermissionService::Stub::Check, r, &out);
  }
  // Heartbeats as h1's agent (reporting nothing) until `done` holds for job `id` or a start
  // order comes, for at most a minute: kcd decides on its own thread, and this test, playing
  // a remote agent, has only its answers to look at.
  std::optional<kc::v1::StartOrder> AwaitStartOr(
      int64_t id, const std::function<bool(const kc::v1::JobInfo&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    kc::v1::AgentHeartbeatRequest beat;
    beat.set_host("h1");
    while (std::chrono::steady_clock::now() < deadline) {
      const kc::v1::AgentHeartbeatResponse orders = Heartbeat(beat);
      if (orders.start_size() > 0) return orders.start(0);
      if (done(Job(id))) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "job " << id << " neither started nor got there: " << Job(id).phase();
    return std::nullopt;
  }

  kc::testing::TempDir dir_{"kc_tokenlife"};
  std::unique_ptr<TokenStore> tokens_;
  std::string root_, ann_, agent_;
  std::unique_ptr<Kcd> kcd_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(TokenLifecycleTest, AnAgentsIdentityCallsTheAgentServiceAloneForItsHostAlone) {
  EXPECT_TRUE(Register(agent_, "h1").ok());
  const grpc::Status other_host = Register(agent_, "h2");
  EXPECT_EQ(other_host.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other_host.error_message(), HasSubstr("only that host's agent"));
  // A system admin's user token is not an agent's.
  const grpc::Status admin = Register(root_, "h1");
  EXPECT_EQ(admin.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(admin.error_message(), HasSubstr("agent's identity"));
  // The agent's identity reaches nothing else: not the jobs, not a permission check.
  kc::v1::ListJobsResponse jobs;
  EXPECT_EQ(As<kc::v1::JobService>(agent_, &kc::v1::JobService::Stub::List,
                                   kc::v1::ListJobsRequest(), &jobs)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(CheckDeviceUse(agent_).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(TokenLifecycleTest, ARunsTokenReachesTheExecutionCheckAloneAndEndsWithItsRun) {
  ASSERT_TRUE(Register(agent_, "h1").ok());
  const int64_t id = Submit(ann_);
  std::optional<kc::v1::StartOrder> start =
      AwaitStartOr(id, [](const kc::v1::JobInfo&) { return false; });
  ASSERT_TRUE(start.has_value());
  const std::string run_token = start->token();
  EXPECT_TRUE(CheckDeviceUse(run_token).ok());
  kc::v1::ListJobsResponse jobs;
  const grpc::Status list = As<kc::v1::JobService>(run_token, &kc::v1::JobService::Stub::List,
                                                   kc::v1::ListJobsRequest(), &jobs);
  EXPECT_EQ(list.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(list.error_message(), HasSubstr("a run's token"));
  // Its lifetime is the job's runtime and a day, not for ever.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir_.Path("kcd.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT expires_s - issued_s FROM tokens WHERE kind = 'run'", -1,
                               &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_NEAR(sqlite3_column_double(st, 0), 3600 + 86400, 1e-3);
  sqlite3_finalize(st);
  sqlite3_close(db);

  // The run ends: its token goes with it.
  kc::v1::AgentHeartbeatRequest beat;
  beat.set_host("h1");
  kc::v1::AgentJobReport* r = beat.add_jobs();
  r->set_job(id);
  r->set_run(start->run());
  r->set_state(kc::v1::AgentJobReport::STATE_EXITED);
  r->set_exit_code(0);
  Heartbeat(beat);
  EXPECT_EQ(Job(id).phase(), "succeeded");
  const grpc::Status after = CheckDeviceUse(run_token);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(after.error_message(), HasSubstr("revoked"));
}

TEST_F(TokenLifecycleTest, ARevokedUsersQueuedJobNeverStarts) {
  // Queued while no agent has brought its devices up.
  const int64_t id = Submit(ann_);
  const auto queued = [](const kc::v1::JobInfo& j) { return j.phase() == "queued"; };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!queued(Job(id)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(Job(id).phase(), "queued");
  ASSERT_TRUE(tokens_->RevokeAll("ann", internal::WallSeconds()).ok());
  // Devices come up: the job is refused as it would start, and no run token is minted for it.
  ASSERT_TRUE(Register(agent_, "h1").ok());
  const std::optional<kc::v1::StartOrder> start =
      AwaitStartOr(id, [](const kc::v1::JobInfo& j) { return j.phase() == "failed"; });
  EXPECT_FALSE(start.has_value()) << "job " << id << " started with run " << start->run();
  const kc::v1::JobInfo j = Job(id);
  EXPECT_EQ(j.phase(), "failed");
  EXPECT_THAT(j.reason(), HasSubstr("tokens were revoked"));
}

TEST_F(TokenLifecycleTest, NoTokenLivesForEver) {
  for (double ttl :
       {std::numeric_limits<double>::infinity(), std::nan(""), 0.0, -1.0, kMaxTokenLifetimeS + 1}) {
    EXPECT_EQ(tokens_->Issue("ann", ttl, 0).status().code(), ErrorCode::kInvalidArgument) << ttl;
  }
  EXPECT_TRUE(tokens_->Issue("ann", kMaxTokenLifetimeS, 0).ok());
}

}  // namespace
}  // namespace kc::api
