#include "api/job_service.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <set>
#include <thread>

#include "api/internal/digest.h"
#include "api/job_spec.h"
#include "tests/support/team_roles.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

constexpr const char* kRoles = kc::testing::kTeamRoles;

// The job service on loopback over real stores, as kcd serves it.
class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string db = dir_.Path("kcd.db");
    tokens_ = std::move(*TokenStore::Open(db));
    jobs_ = std::move(*JobStore::Open(db));
    quotas_ = std::move(*QuotaStore::Open(db));
    audit_ = std::move(*AuditLog::Open(dir_.Path("audit.db")));
    roles_ = *LoadRolesString(kRoles, "roles.yaml");
    guard_ = std::make_unique<RpcGuard>(
        RpcGuardOptions{.tokens = tokens_.get(), .roles = &roles_, .audit = audit_.get()});
    for (const char* u : {"root", "vera", "ann", "abe", "bob", "olga"}) {
      token_[u] = tokens_->Issue(u, 3600, internal::WallSeconds())->token;
    }
    Serve({});
  }
  // (Re)starts the service with `options`.
  void Serve(JobServiceOptions options) {
    if (server_ != nullptr) server_->Shutdown();
    service_ = std::make_unique<JobServiceImpl>(guard_.get(), &roles_, jobs_.get(), quotas_.get(),
                                                audit_.get(), nullptr, options);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    stub_ = kc::v1::JobService::NewStub(
        grpc::CreateChannel(fmt::format("127.0.0.1:{}", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  // Calls `method` as `user`.
  template <typename Req, typename Resp, typename Method>
  grpc::Status As(const std::string& user, Method method, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_[user]);
    return (stub_.get()->*method)(&ctx, req, resp);
  }
  grpc::Status Submit(const std::string& user, const std::string& name, int64_t devices,
                      kc::v1::JobInfo* out, const std::string& team = "") {
    kc::v1::SubmitJobRequest r;
    r.set_name(name);
    r.set_team(team);
    r.set_devices(devices);
    r.set_expected_hours(1);
    return As(user, &kc::v1::JobService::Stub::Submit, r, out);
  }
  grpc::Status Get(const std::string& user, int64_t id) {
    kc::v1::GetJobRequest r;
    r.set_id(id);
    kc::v1::JobInfo out;
    return As(user, &kc::v1::JobService::Stub::Get, r, &out);
  }
  grpc::Status Cancel(const std::string& user, int64_t id) {
    kc::v1::CancelJobRequest r;
    r.set_id(id);
    kc::v1::JobInfo out;
    return As(user, &kc::v1::JobService::Stub::Cancel, r, &out);
  }
  std::set<std::string> Visible(const std::string& user) {
    kc::v1::ListJobsResponse out;
    EXPECT_TRUE(As(user, &kc::v1::JobService::Stub::List, kc::v1::ListJobsRequest(), &out).ok());
    std::set<std::string> names;
    for (const kc::v1::JobInfo& j : out.jobs()) names.insert(j.name());
    return names;
  }

  testing::TempDir dir_{"kc_jobsvc"};
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<JobStore> jobs_;
  std::unique_ptr<QuotaStore> quotas_;
  std::unique_ptr<AuditLog> audit_;
  RolesConfig roles_;
  std::unique_ptr<RpcGuard> guard_;
  std::unique_ptr<JobServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<kc::v1::JobService::Stub> stub_;
  std::map<std::string, std::string> token_;
};

// Each role against each method, on a job of team vision owned by ann.
TEST_F(JobServiceTest, EachRoleMayDoWhatTheTableSays) {
  kc::v1::JobInfo ann_job, bob_job;
  ASSERT_TRUE(Submit("ann", "ann-train", 2, &ann_job).ok());
  EXPECT_EQ(ann_job.owner(), "ann");
  EXPECT_EQ(ann_job.team(), "vision");
  EXPECT_EQ(ann_job.phase(), "pending");
  ASSERT_TRUE(Submit("bob", "bob-train", 2, &bob_job).ok());
  kc::v1::JobInfo x;
  EXPECT_EQ(Submit("olga", "nope", 1, &x).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Submit("bob", "sneaky", 1, &x, "vision").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);  // not in that team
  // A team the roles file does not name, even for a system admin.
  grpc::Status unknown = Submit("root", "nowhere", 1, &x, "visoin");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(unknown.error_message(), HasSubstr("team: no team \"visoin\" in the roles file"));
  // Reading.
  EXPECT_TRUE(Get("ann", ann_job.id()).ok());
  EXPECT_TRUE(Get("vera", ann_job.id()).ok());  // her team's
  EXPECT_TRUE(Get("olga", ann_job.id()).ok());  // observers read everything
  EXPECT_TRUE(Get("root", ann_job.id()).ok());
  grpc::Status s = Get("bob", ann_job.id());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("only its own; this belongs to ann"));
  EXPECT_EQ(Get("vera", bob_job.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Get("ann", 999).error_code(), grpc::StatusCode::NOT_FOUND);
  // Listing shows each caller its scope.
  EXPECT_EQ(Visible("ann"), (std::set<std::string>{"ann-train"}));
  EXPECT_EQ(Visible("abe"), (std::set<std::string>{}));
  EXPECT_EQ(Visible("vera"), (std::set<std::string>{"ann-train"}));
  EXPECT_EQ(Visible("bob"), (std::set<std::string>{"bob-train"}));
  EXPECT_EQ(Visible("olga"), (std::set<std::string>{"ann-train", "bob-train"}));
  EXPECT_EQ(Visible("root"), (std::set<std::string>{"ann-train", "bob-train"}));
  // Cancelling: observers and other submitters may not; a team's admin may.
  EXPECT_EQ(Cancel("olga", ann_job.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Cancel("abe", ann_job.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Cancel("bob", ann_job.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Cancel("vera", ann_job.id()).ok());
  s = Cancel("ann", ann_job.id());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("cannot go from cancelled to cancelled"));
  EXPECT_TRUE(Cancel("bob", bob_job.id()).ok());
  // Every change and every denial is in the audit log, and the chain holds.
  EXPECT_EQ(audit_->Query({.action = "job.submit"})->size(), 4u);  // 2 ok, 2 denied
  EXPECT_EQ(audit_->Query({.action = "job.cancel"})->size(), 5u);  // 3 denied, 2 ok
  EXPECT_EQ(audit_->Query({.action = "job.get"})->size(), 2u);     // the two denials
  EXPECT_TRUE(audit_->Verify()->ok);
}

// A command job is a job like any other at submission: its devices count against the quotas.
TEST_F(JobServiceTest, ACommandJobOverQuotaIsRefusedAsAnyJob) {
  ASSERT_TRUE(quotas_->Set(QuotaSubject::kTeam, "vision", {.max_devices = 2}).ok());
  JobSpec spec{.name = "ddp", .command = {"python3", "train.py"}};
  spec.ranks = 4;
  kc::v1::SubmitJobRequest r;
  r.set_name("ddp");
  r.set_devices(4);
  r.set_expected_hours(1);
  r.set_spec(JobSpecText(spec));
  kc::v1::JobInfo out;
  grpc::Status s = As("ann", &kc::v1::JobService::Stub::Submit, r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("team vision: over quota: max_devices 2"));
  spec.ranks = 2;
  r.set_devices(2);
  r.set_spec(JobSpecText(spec));
  EXPECT_TRUE(As("ann", &kc::v1::JobService::Stub::Submit, r, &out).ok());
}

TEST_F(JobServiceTest, QuotasRefuseWithTheNumbers) {
  ASSERT_TRUE(quotas_->Set(QuotaSubject::kTeam, "vision", {.max_devices = 8}).ok());
  ASSERT_TRUE(quotas_->Set(QuotaSubject::kUser, "bob", {.max_device_hours = 3}).ok());
  kc::v1::JobInfo j;
  ASSERT_TRUE(Submit("ann", "six", 6, &j).ok());
  grpc::Status s = Submit("abe", "four", 4, &j);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(),
              HasSubstr("team vision: over quota: max_devices 8: 6 in use + 4 asked = 10"));
  EXPECT_TRUE(Submit("abe", "two", 2, &j).ok());
  s = Submit("bob", "long", 4, &j);  // 4 devices x 1 h = 4 device-h > 3
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("user bob: over quota: max_device_hours 3"));
  // A cancelled job's devices are free again.
  kc::v1::JobInfo six;
  ASSERT_TRUE(Submit("vera", "v", 0, &six).ok());
  Result<std::vector<JobRecord>> vision = jobs_->List({.owner = "ann"});
  ASSERT_TRUE(Cancel("ann", (*vision)[0].id).ok());
  EXPECT_TRUE(Submit("abe", "four-again", 4, &j).ok());
}

// Numbers from the wire are finite and bounded: an infinite or NaN runtime would make an
// unbounded quota booking and run token.
TEST_F(JobServiceTest, NonFiniteNumbersAreRefused) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double hours : {inf, std::nan(""), 1e12}) {
    kc::v1::SubmitJobRequest r;
    r.set_name("x");
    r.set_devices(1);
    r.set_expected_hours(hours);
    kc::v1::JobInfo out;
    EXPECT_EQ(As("ann", &kc::v1::JobService::Stub::Submit, r, &out).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << hours;
    r.set_expected_hours(1);
    r.set_storage_gb(hours);
    EXPECT_EQ(As("ann", &kc::v1::JobService::Stub::Submit, r, &out).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << hours;
  }
  kc::v1::JobInfo job;
  ASSERT_TRUE(Submit("ann", "fine", 1, &job).ok());
  for (double hours : {inf, std::nan("")}) {
    kc::v1::ModifyJobRequest m;
    m.set_id(job.id());
    m.set_expected_hours(hours);
    kc::v1::JobInfo out;
    EXPECT_EQ(As("ann", &kc::v1::JobService::Stub::Modify, m, &out).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << hours;
  }
  EXPECT_EQ(jobs_->Get(job.id())->device_hours, 1);
}

// One user's jobs that have not ended are bounded; an ended one makes room.
TEST_F(JobServiceTest, AUserMayHaveABoundedNumberOfJobsThatHaveNotEnded) {
  Serve({.max_active_jobs_per_user = 2});
  kc::v1::JobInfo a, b, x;
  ASSERT_TRUE(Submit("ann", "a", 1, &a).ok());
  ASSERT_TRUE(Submit("ann", "b", 1, &b).ok());
  const grpc::Status third = Submit("ann", "c", 1, &x);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("2 jobs that have not ended"));
  EXPECT_TRUE(Submit("abe", "theirs", 1, &x).ok());  // another user's room
  ASSERT_TRUE(Cancel("ann", a.id()).ok());
  EXPECT_TRUE(Submit("ann", "c", 1, &x).ok());
}

// Submissions that arrive together cannot both take the last of a quota: the check and the
// write are one step. Sixteen at once for one device each, four devices left: four get in.
TEST_F(JobServiceTest, ConcurrentSubmissionsNeverTakeMoreThanTheQuota) {
  ASSERT_TRUE(quotas_->Set(QuotaSubject::kTeam, "vision", {.max_devices = 4}).ok());
  std::vector<std::thread> threads;
  std::atomic<int> accepted{0}, refused{0};
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      kc::v1::JobInfo out;
      const grpc::Status s = Submit(i % 2 ? "ann" : "abe", "j" + std::to_string(i), 1, &out);
      (s.ok() ? accepted : refused)++;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(accepted.load(), 4);
  EXPECT_EQ(refused.load(), 12);
  EXPECT_EQ(jobs_->List({.active = true})->size(), 4u);
}

}  // namespace
}  // namespace kc::api
