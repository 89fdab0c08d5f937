// Who may do what to whose jobs and plans, over RPC against kcd in process: every role (and a
// resource admin who is a member, not an admin, of a second team) against every method of the
// job and plan services, on jobs of each scope, each answer derived from the permission table
// for the action the method declares (its kc.v1.permission).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>

#include "api/control_plane.h"
#include "api/internal/digest.h"
#include "api/roles_file.h"
#include "api/tokens.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/options.pb.h"
#include "kc/v1/plans.grpc.pb.h"
#include "tests/support/kcd_in_process.h"
#include "tests/support/team_roles.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;
namespace pb = google::protobuf;

constexpr const char* kRoles = kc::testing::kTeamRoles;
const char* const kUsers[] = {"root", "vera", "ann", "bob", "olga"};

class AuthorizationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(InitCluster({.dir = dir_.path(), .admin = "root"}).ok());
    dir_.Write("roles.yaml", kRoles);
    roles_ = *LoadRolesString(kRoles, "roles.yaml");
    {
      std::unique_ptr<TokenStore> tokens = std::move(*TokenStore::Open(dir_.Path("kcd.db")));
      for (const char* u : kUsers) {
        token_[u] = tokens->Issue(u, 3600, internal::WallSeconds())->token;
      }
    }
    Result<kc::testing::KcdInProcess> kcd = kc::testing::StartKcdInProcess({.dir = dir_.path()});
    ASSERT_TRUE(kcd.ok()) << kcd.status().message();
    kcd_ = std::move(kcd->kcd);
    jobs_ = kc::v1::JobService::NewStub(kcd->channel);
    plans_ = kc::v1::PlanService::NewStub(kcd->channel);
  }
  void TearDown() override {
    if (kcd_ != nullptr) kcd_->Shutdown();
  }

  template <typename Stub, typename Req, typename Resp, typename Method>
  grpc::Status As(const std::string& user, Stub* stub, Method method, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_[user]);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return (stub->*method)(&ctx, req, resp);
  }

  // A job of `user` for `team` (no spec: it waits in the store).
  kc::v1::JobInfo Submit(const std::string& user, const std::string& team) {
    kc::v1::SubmitJobRequest r;
    r.set_name(user + "-job");
    r.set_team(team);
    r.set_devices(1);
    r.set_expected_hours(1);
    kc::v1::JobInfo out;
    const grpc::Status s = As(user, jobs_.get(), &kc::v1::JobService::Stub::Submit, r, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  kc::testing::TempDir dir_{"kc_authz"};
  RolesConfig roles_;
  std::map<std::string, std::string> token_;
  std::unique_ptr<Kcd> kcd_;
  std::unique_ptr<kc::v1::JobService::Stub> jobs_;
  std::unique_ptr<kc::v1::PlanService::Stub> plans_;
};

// One method on one job, as any user.
struct Call {
  std::string method;  // full name
  std::function<grpc::Status(const std::string& user, int64_t job)> call;
};

TEST_F(AuthorizationTest, EveryRoleMayActOnTheJobsAndPlansTheTableSaysAndNoOthers) {
  // Jobs of each scope: ann's (vision, which vera administers), vera's own, bob's (nlp, of
  // which vera is only a member).
  std::vector<kc::v1::JobInfo> jobs = {Submit("ann", "vision"), Submit("vera", "vision"),
                                       Submit("bob", "nlp")};
  const std::vector<Call> calls = {
      {"kc.v1.JobService.Get",
       [&](const std::string& u, int64_t id) {
         kc::v1::GetJobRequest r;
         r.set_id(id);
         kc::v1::JobInfo out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Get, r, &out);
       }},
      {"kc.v1.JobService.Logs",
       [&](const std::string& u, int64_t id) {
         kc::v1::JobLogsRequest r;
         r.set_id(id);
         kc::v1::JobLogsResponse out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Logs, r, &out);
       }},
      {"kc.v1.JobService.Records",
       [&](const std::string& u, int64_t id) {
         kc::v1::JobRecordsRequest r;
         r.set_id(id);
         kc::v1::JobRecordsResponse out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Records, r, &out);
       }},
      {"kc.v1.JobService.Inspect",
       [&](const std::string& u, int64_t id) {
         kc::v1::InspectJobRequest r;
         r.set_id(id);
         kc::v1::InspectJobResponse out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Inspect, r, &out);
       }},
      {"kc.v1.JobService.Modify",
       [&](const std::string& u, int64_t id) {
         kc::v1::ModifyJobRequest r;
         r.set_id(id);
         r.set_name("renamed");
         r.set_expected_hours(-1);
         kc::v1::JobInfo out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Modify, r, &out);
       }},
      {"kc.v1.PlanService.Get",
       [&](const std::string& u, int64_t id) {
         kc::v1::GetPlanRequest r;
         r.set_job(id);
         kc::v1::PlanInfo out;
         return As(u, plans_.get(), &kc::v1::PlanService::Stub::Get, r, &out);
       }},
      {"kc.v1.PlanService.Approve",
       [&](const std::string& u, int64_t id) {
         kc::v1::DecidePlanRequest r;
         r.set_job(id);
         kc::v1::PlanInfo out;
         return As(u, plans_.get(), &kc::v1::PlanService::Stub::Approve, r, &out);
       }},
      {"kc.v1.PlanService.Deny",
       [&](const std::string& u, int64_t id) {
         kc::v1::DecidePlanRequest r;
         r.set_job(id);
         r.set_note("no");
         kc::v1::PlanInfo out;
         return As(u, plans_.get(), &kc::v1::PlanService::Stub::Deny, r, &out);
       }},
      // Those that change the phase last: once a job has moved on, the next caller's answer is
      // about its phase, never a denial it should not get.
      {"kc.v1.JobService.Pause",
       [&](const std::string& u, int64_t id) {
         kc::v1::PauseJobRequest r;
         r.set_id(id);
         kc::v1::JobInfo out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Pause, r, &out);
       }},
      {"kc.v1.JobService.Resume",
       [&](const std::string& u, int64_t id) {
         kc::v1::ResumeJobRequest r;
         r.set_id(id);
         kc::v1::JobInfo out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Resume, r, &out);
       }},
      {"kc.v1.JobService.Cancel",
       [&](const std::string& u, int64_t id) {
         kc::v1::CancelJobRequest r;
         r.set_id(id);
         kc::v1::JobInfo out;
         return As(u, jobs_.get(), &kc::v1::JobService::Stub::Cancel, r, &out);
       }},
  };
  // Every method on one job, except Submit and List (below), is covered.
  std::set<std::string> covered, methods;
  for (const Call& c : calls) covered.insert(c.method);
  for (const char* s : {"kc.v1.JobService", "kc.v1.PlanService"}) {
    const pb::ServiceDescriptor* sd = pb::DescriptorPool::generated_pool()->FindServiceByName(s);
    ASSERT_NE(sd, nullptr) << s;
    for (int i = 0; i < sd->method_count(); ++i) methods.insert(sd->method(i)->full_name());
  }
  methods.erase("kc.v1.JobService.Submit");
  methods.erase("kc.v1.JobService.List");
  EXPECT_EQ(covered, methods);

  int denials = 0;
  for (const Call& c : calls) {
    const pb::MethodDescriptor* md =
        pb::DescriptorPool::generated_pool()->FindMethodByName(c.method);
    ASSERT_NE(md, nullptr) << c.method;
    const std::optional<Action> action =
        ActionFromName(md->options().GetExtension(kc::v1::permission));
    ASSERT_TRUE(action.has_value()) << c.method;
    for (const kc::v1::JobInfo& job : jobs) {
      for (const char* user : kUsers) {
        const CheckResult expected = Check(*roles_.PrincipalFor(user), *action,
                                           {.kind = "job",
                                            .id = std::to_string(job.id()),
                                            .owner = job.owner(),
                                            .team = job.team()});
        const grpc::Status got = c.call(user, job.id());
        SCOPED_TRACE(fmt::format("{} as {} on {}'s job: {} ({})", c.method, user, job.owner(),
                                 got.error_message(), expected.reason));
        if (expected.allowed) {
          EXPECT_NE(got.error_code(), grpc::StatusCode::PERMISSION_DENIED);
          EXPECT_NE(got.error_code(), grpc::StatusCode::INTERNAL);
        } else {
          EXPECT_EQ(got.error_code(), grpc::StatusCode::PERMISSION_DENIED);
          ++denials;
        }
      }
    }
  }
  EXPECT_GT(denials, 0);
}

// The cases the review found, spelled out: a resource admin acts on the jobs of the team she
// administers, not on those of a team she is only a member of, and never decides her own
// job's plan.
TEST_F(AuthorizationTest, AMemberWhoIsNotTheTeamsAdminDecidesNothingOfItsAndNoOneTheirOwnPlan) {
  const kc::v1::JobInfo ann = Submit("ann", "vision");
  const kc::v1::JobInfo bob = Submit("bob", "nlp");
  const kc::v1::JobInfo vera = Submit("vera", "vision");
  auto approve = [&](const std::string& user, int64_t job) {
    kc::v1::DecidePlanRequest r;
    r.set_job(job);
    kc::v1::PlanInfo out;
    return As(user, plans_.get(), &kc::v1::PlanService::Stub::Approve, r, &out);
  };
  auto cancel = [&](const std::string& user, int64_t job) {
    kc::v1::CancelJobRequest r;
    r.set_id(job);
    kc::v1::JobInfo out;
    return As(user, jobs_.get(), &kc::v1::JobService::Stub::Cancel, r, &out);
  };
  // Allowed, then refused for the job's phase (it waits for nothing to approve).
  EXPECT_EQ(approve("vera", ann.id()).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(approve("vera", bob.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  const grpc::Status own = approve("vera", vera.id());
  EXPECT_EQ(own.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(own.error_message(), HasSubstr("never on its own request or job"));
  EXPECT_EQ(approve("root", vera.id()).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(cancel("vera", bob.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(cancel("vera", ann.id()).ok());
  EXPECT_TRUE(cancel("vera", vera.id()).ok());
  // Submitting for a team takes being in it.
  kc::v1::SubmitJobRequest r;
  r.set_name("x");
  r.set_team("nlp");
  kc::v1::JobInfo out;
  EXPECT_EQ(As("ann", jobs_.get(), &kc::v1::JobService::Stub::Submit, r, &out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Each sees its scope of the list: ann her own, vera vision's and her own, olga all.
  for (const auto& [user, want] : std::map<std::string, size_t>{
           {"ann", 1}, {"bob", 1}, {"vera", 2}, {"olga", 3}, {"root", 3}}) {
    kc::v1::ListJobsResponse list;
    ASSERT_TRUE(
        As(user, jobs_.get(), &kc::v1::JobService::Stub::List, kc::v1::ListJobsRequest(), &list)
            .ok());
    EXPECT_EQ(static_cast<size_t>(list.jobs_size()), want) << user;
  }
}

}  // namespace
}  // namespace kc::api
