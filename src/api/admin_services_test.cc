// The admin services over RPC (quotas, audit, topology, pools), in process on loopback over
// real stores and a real cluster directory: each role against each method, with the expected
// answers derived from the permission table; quota requests through to a submission; audit
// queries and a tampered chain; replacing the topology and pools files.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <functional>
#include <set>

#include "api/audit_service.h"
#include "api/cluster_config_service.h"
#include "api/internal/digest.h"
#include "api/job_service.h"
#include "api/quota_service.h"
#include "base/file.h"
#include "kc/v1/options.pb.h"
#include "tests/support/repo_root.h"
#include "tests/support/team_roles.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;
namespace pb = google::protobuf;

constexpr const char* kRoles = kc::testing::kTeamRoles;
const char* const kUsers[] = {"root", "vera", "ann", "abe", "bob", "olga"};

// Four DGX A100 hosts of 8 devices (examples/clusters/dgx-a100x4.yaml).
std::string Inventory() {
  return *ReadWholeFile(kc::testing::RepoRoot() + "examples/clusters/dgx-a100x4.yaml");
}

class AdminServicesTest : public ::testing::Test {
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
    cluster_ = std::make_unique<ClusterDir>(dir_.path());
    job_service_ = std::make_unique<JobServiceImpl>(guard_.get(), &roles_, jobs_.get(),
                                                    quotas_.get(), audit_.get());
    quota_service_ = std::make_unique<QuotaServiceImpl>(guard_.get(), &roles_, quotas_.get(),
                                                        jobs_.get(), audit_.get());
    audit_service_ = std::make_unique<AuditServiceImpl>(guard_.get(), &roles_, audit_.get());
    topology_service_ =
        std::make_unique<TopologyServiceImpl>(guard_.get(), cluster_.get(), audit_.get());
    pool_service_ = std::make_unique<PoolServiceImpl>(guard_.get(), cluster_.get(), audit_.get());
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    for (grpc::Service* s : std::initializer_list<grpc::Service*>{
             job_service_.get(), quota_service_.get(), audit_service_.get(),
             topology_service_.get(), pool_service_.get()}) {
      b.RegisterService(s);
    }
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto channel =
        grpc::CreateChannel(fmt::format("127.0.0.1:{}", port), grpc::InsecureChannelCredentials());
    jobs_stub_ = kc::v1::JobService::NewStub(channel);
    quota_stub_ = kc::v1::QuotaService::NewStub(channel);
    audit_stub_ = kc::v1::AuditService::NewStub(channel);
    topology_stub_ = kc::v1::TopologyService::NewStub(channel);
    pool_stub_ = kc::v1::PoolService::NewStub(channel);
    for (const char* u : kUsers) {
      token_[u] = tokens_->Issue(u, 3600, internal::WallSeconds())->token;
    }
  }
  void TearDown() override { server_->Shutdown(); }

  // Calls `method` of `stub` as `user`.
  template <typename Stub, typename Req, typename Resp, typename Method>
  grpc::Status As(const std::string& user, Stub* stub, Method method, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_[user]);
    return (stub->*method)(&ctx, req, resp);
  }

  grpc::Status Submit(const std::string& user, int64_t devices, const std::string& team = "") {
    kc::v1::SubmitJobRequest r;
    r.set_name("train");
    r.set_team(team);
    r.set_devices(devices);
    r.set_expected_hours(1);
    kc::v1::JobInfo out;
    return As(user, jobs_stub_.get(), &kc::v1::JobService::Stub::Submit, r, &out);
  }
  grpc::Status RequestQuota(const std::string& user, const std::string& subject,
                            const std::string& name, int64_t max_devices,
                            kc::v1::QuotaRequestInfo* out) {
    kc::v1::QuotaIncreaseRequest r;
    r.set_subject(subject);
    r.set_name(name);
    r.mutable_wanted()->set_max_devices(max_devices);
    r.set_reason("a bigger run");
    return As(user, quota_stub_.get(), &kc::v1::QuotaService::Stub::RequestIncrease, r, out);
  }
  grpc::Status Decide(const std::string& user, int64_t id, bool approve,
                      kc::v1::QuotaRequestInfo* out) {
    kc::v1::DecideQuotaRequest r;
    r.set_id(id);
    r.set_reason("ok by me");
    return As(user, quota_stub_.get(),
              approve ? &kc::v1::QuotaService::Stub::Approve : &kc::v1::QuotaService::Stub::Deny, r,
              out);
  }
  grpc::Status GetQuota(const std::string& user, const std::string& subject,
                        const std::string& name, kc::v1::QuotaInfo* out) {
    kc::v1::GetQuotaRequest r;
    r.set_subject(subject);
    r.set_name(name);
    return As(user, quota_stub_.get(), &kc::v1::QuotaService::Stub::Get, r, out);
  }
  grpc::Status PutTopology(const std::string& user, const std::string& text) {
    kc::v1::PutTopologyRequest r;
    r.set_inventory(text);
    kc::v1::PutTopologyResponse out;
    return As(user, topology_stub_.get(), &kc::v1::TopologyService::Stub::Put, r, &out);
  }
  grpc::Status PutPools(const std::string& user, const std::string& text,
                        kc::v1::PutPoolsResponse* out) {
    kc::v1::PutPoolsRequest r;
    r.set_pools(text);
    return As(user, pool_stub_.get(), &kc::v1::PoolService::Stub::Put, r, out);
  }
  grpc::Status Query(const std::string& user, const kc::v1::AuditQueryRequest& q,
                     kc::v1::AuditQueryResponse* out) {
    return As(user, audit_stub_.get(), &kc::v1::AuditService::Stub::Query, q, out);
  }
  std::string File(const std::string& name) {
    Result<std::string> text = ReadWholeFile(dir_.Path(name));
    return text.ok() ? *text : "(" + std::string(text.status().message()) + ")";
  }

  kc::testing::TempDir dir_{"kc_adminsvc"};
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<JobStore> jobs_;
  std::unique_ptr<QuotaStore> quotas_;
  std::unique_ptr<AuditLog> audit_;
  RolesConfig roles_;
  std::unique_ptr<RpcGuard> guard_;
  std::unique_ptr<ClusterDir> cluster_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<QuotaServiceImpl> quota_service_;
  std::unique_ptr<AuditServiceImpl> audit_service_;
  std::unique_ptr<TopologyServiceImpl> topology_service_;
  std::unique_ptr<PoolServiceImpl> pool_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<kc::v1::JobService::Stub> jobs_stub_;
  std::unique_ptr<kc::v1::QuotaService::Stub> quota_stub_;
  std::unique_ptr<kc::v1::AuditService::Stub> audit_stub_;
  std::unique_ptr<kc::v1::TopologyService::Stub> topology_stub_;
  std::unique_ptr<kc::v1::PoolService::Stub> pool_stub_;
  std::map<std::string, std::string> token_;
};

// One call of a method: what it acts on (as the permission table sees it, for a caller) and
// how to make it.
struct Case {
  std::string method;  // full name, "kc.v1.QuotaService.Get"
  std::function<Resource(const Principal& caller)> resource;
  std::function<grpc::Status(const std::string& user)> call;
};

// Every method of the admin services, called by every role: allowed exactly when the
// permission table says so for the action the method declares (its kc.v1.permission).
TEST_F(AdminServicesTest, EachRoleMayCallWhatTheTableSays) {
  ASSERT_TRUE(PutTopology("root", Inventory()).ok());
  kc::v1::QuotaRequestInfo ann_request, nlp_request;
  ASSERT_TRUE(RequestQuota("ann", "user", "ann", 16, &ann_request).ok());
  // vera is a member of nlp, not its admin: she may ask for nlp, not decide for it.
  ASSERT_TRUE(RequestQuota("bob", "team", "nlp", 16, &nlp_request).ok());
  // Resources: a user's quota belongs to the user, in its team; a team's quota to the team,
  // and its members count as its owners; collections (a listing, the audit log, the topology
  // and pools to read) name no id; the files to replace name themselves.
  const auto ann_quota = [](const Principal&) {
    return Resource{.kind = "quota", .id = "user/ann", .owner = "ann", .team = "vision"};
  };
  const auto vision_quota = [](const Principal& p) {
    const bool member = std::find(p.teams.begin(), p.teams.end(), "vision") != p.teams.end();
    return Resource{
        .kind = "quota", .id = "team/vision", .owner = member ? p.user : "", .team = "vision"};
  };
  // A decision's resource is the request, owned by whoever asked.
  const auto nlp_decision = [&](const Principal&) {
    return Resource{.kind = "quota-request",
                    .id = std::to_string(nlp_request.id()),
                    .owner = "bob",
                    .team = "nlp"};
  };
  const auto collection = [](std::string kind) {
    return [kind](const Principal&) { return Resource{.kind = kind}; };
  };
  const auto file = [](std::string kind, std::string name) {
    return [kind, name](const Principal&) { return Resource{.kind = kind, .id = name}; };
  };
  const std::vector<Case> cases = {
      {"kc.v1.QuotaService.Get", ann_quota,
       [&](const std::string& u) {
         kc::v1::QuotaInfo out;
         return GetQuota(u, "user", "ann", &out);
       }},
      {"kc.v1.QuotaService.Get", vision_quota,
       [&](const std::string& u) {
         kc::v1::QuotaInfo out;
         return GetQuota(u, "team", "vision", &out);
       }},
      {"kc.v1.QuotaService.RequestIncrease", ann_quota,
       [&](const std::string& u) {
         kc::v1::QuotaRequestInfo out;
         return RequestQuota(u, "user", "ann", 8, &out);
       }},
      {"kc.v1.QuotaService.RequestIncrease", vision_quota,
       [&](const std::string& u) {
         kc::v1::QuotaRequestInfo out;
         return RequestQuota(u, "team", "vision", 64, &out);
       }},
      {"kc.v1.QuotaService.ListRequests", collection("quota"),
       [&](const std::string& u) {
         kc::v1::ListQuotaRequestsResponse out;
         return As(u, quota_stub_.get(), &kc::v1::QuotaService::Stub::ListRequests,
                   kc::v1::ListQuotaRequestsRequest(), &out);
       }},
      // A request decided by the first allowed caller is FAILED_PRECONDITION for the next:
      // not a denial.
      {"kc.v1.QuotaService.Approve", ann_quota,
       [&](const std::string& u) {
         kc::v1::QuotaRequestInfo out;
         return Decide(u, ann_request.id(), true, &out);
       }},
      {"kc.v1.QuotaService.Deny", ann_quota,
       [&](const std::string& u) {
         kc::v1::QuotaRequestInfo out;
         return Decide(u, ann_request.id(), false, &out);
       }},
      {"kc.v1.QuotaService.Approve", nlp_decision,
       [&](const std::string& u) {
         kc::v1::QuotaRequestInfo out;
         return Decide(u, nlp_request.id(), true, &out);
       }},
      {"kc.v1.AuditService.Query", collection("audit"),
       [&](const std::string& u) {
         kc::v1::AuditQueryResponse out;
         return Query(u, kc::v1::AuditQueryRequest(), &out);
       }},
      {"kc.v1.AuditService.Verify", collection("audit"),
       [&](const std::string& u) {
         kc::v1::AuditVerifyResponse out;
         return As(u, audit_stub_.get(), &kc::v1::AuditService::Stub::Verify,
                   kc::v1::AuditVerifyRequest(), &out);
       }},
      {"kc.v1.TopologyService.Get", collection("topology"),
       [&](const std::string& u) {
         kc::v1::TopologyInfo out;
         return As(u, topology_stub_.get(), &kc::v1::TopologyService::Stub::Get,
                   kc::v1::GetTopologyRequest(), &out);
       }},
      {"kc.v1.TopologyService.Put", file("topology", "topology.yaml"),
       [&](const std::string& u) { return PutTopology(u, Inventory()); }},
      {"kc.v1.PoolService.List", collection("pool"),
       [&](const std::string& u) {
         kc::v1::ListPoolsResponse out;
         return As(u, pool_stub_.get(), &kc::v1::PoolService::Stub::List,
                   kc::v1::ListPoolsRequest(), &out);
       }},
      {"kc.v1.PoolService.Put", file("pool", "pools.yaml"),
       [&](const std::string& u) {
         kc::v1::PutPoolsResponse out;
         return PutPools(u, "pools:\n  - {name: all, classes: [normal], rest: true}\n", &out);
       }},
  };
  // Every method of the four services is covered.
  std::set<std::string> covered, methods;
  for (const Case& c : cases) covered.insert(c.method);
  for (const char* s :
       {"kc.v1.QuotaService", "kc.v1.AuditService", "kc.v1.TopologyService", "kc.v1.PoolService"}) {
    const pb::ServiceDescriptor* sd = pb::DescriptorPool::generated_pool()->FindServiceByName(s);
    ASSERT_NE(sd, nullptr) << s;
    for (int i = 0; i < sd->method_count(); ++i) methods.insert(sd->method(i)->full_name());
  }
  EXPECT_EQ(covered, methods);

  int denials = 0;
  for (const Case& c : cases) {
    const pb::MethodDescriptor* md =
        pb::DescriptorPool::generated_pool()->FindMethodByName(c.method);
    ASSERT_NE(md, nullptr) << c.method;
    const std::optional<Action> action =
        ActionFromName(md->options().GetExtension(kc::v1::permission));
    ASSERT_TRUE(action.has_value()) << c.method << " declares no known kc.v1.permission";
    for (const char* user : kUsers) {
      const Principal p = *roles_.PrincipalFor(user);
      const CheckResult expected = Check(p, *action, c.resource(p));
      const grpc::Status got = c.call(user);
      SCOPED_TRACE(
          fmt::format("{} as {}: {} ({})", c.method, user, got.error_message(), expected.reason));
      if (expected.allowed) {
        EXPECT_NE(got.error_code(), grpc::StatusCode::PERMISSION_DENIED);
        EXPECT_NE(got.error_code(), grpc::StatusCode::INTERNAL);
      } else {
        EXPECT_EQ(got.error_code(), grpc::StatusCode::PERMISSION_DENIED);
        ++denials;
      }
    }
  }
  EXPECT_GT(denials, 0);
  // The member who is not the team's admin was refused.
  kc::v1::QuotaRequestInfo refused;
  EXPECT_EQ(Decide("vera", nlp_request.id(), true, &refused).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ++denials;
  // Every denial is in the audit log, and the chain holds.
  int denied_records = 0;
  const std::vector<AuditRecord> records = *audit_->Query({.limit = 1 << 30});
  for (const AuditRecord& r : records) {
    denied_records += r.outcome == "denied";
  }
  EXPECT_EQ(denied_records, denials);
  EXPECT_TRUE(audit_->Verify()->ok);
}

// A quota request, approved, lets a submission through that was over quota; deciding it again
// is refused; a denied request leaves the quota as it was.
TEST_F(AdminServicesTest, AnApprovedRequestRaisesTheQuotaOnce) {
  ASSERT_TRUE(quotas_->Set(QuotaSubject::kTeam, "vision", {.max_devices = 4}).ok());
  ASSERT_TRUE(Submit("ann", 4).ok());
  grpc::Status s = Submit("abe", 2);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("team vision: over quota: max_devices 4"));

  kc::v1::QuotaInfo q;
  ASSERT_TRUE(GetQuota("abe", "team", "vision", &q).ok());
  EXPECT_EQ(q.limits().max_devices(), 4);
  EXPECT_FALSE(q.limits().has_max_device_hours());
  EXPECT_EQ(q.usage().devices(), 4);
  EXPECT_EQ(q.usage().device_hours(), 4);

  kc::v1::QuotaRequestInfo req;
  ASSERT_TRUE(RequestQuota("abe", "team", "vision", 8, &req).ok());
  EXPECT_EQ(req.state(), "pending");
  EXPECT_EQ(req.requester(), "abe");
  // vera, the team's admin, sees it; bob's request for himself is not hers to decide.
  kc::v1::QuotaRequestInfo bob_req;
  ASSERT_TRUE(RequestQuota("bob", "user", "", 32, &bob_req).ok());
  EXPECT_EQ(bob_req.name(), "bob");
  kc::v1::ListQuotaRequestsResponse listed;
  ASSERT_TRUE(As("vera", quota_stub_.get(), &kc::v1::QuotaService::Stub::ListRequests,
                 kc::v1::ListQuotaRequestsRequest(), &listed)
                  .ok());
  ASSERT_EQ(listed.requests_size(), 1);
  EXPECT_EQ(listed.requests(0).id(), req.id());
  ASSERT_TRUE(As("root", quota_stub_.get(), &kc::v1::QuotaService::Stub::ListRequests,
                 kc::v1::ListQuotaRequestsRequest(), &listed)
                  .ok());
  EXPECT_EQ(listed.requests_size(), 2);

  kc::v1::QuotaRequestInfo decided;
  EXPECT_EQ(Decide("ann", req.id(), true, &decided).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(Decide("vera", req.id(), true, &decided).ok());
  EXPECT_EQ(decided.state(), "approved");
  EXPECT_EQ(decided.decided_by(), "vera");
  EXPECT_TRUE(Submit("abe", 2).ok());  // 4 + 2 <= 8
  ASSERT_TRUE(GetQuota("abe", "team", "vision", &q).ok());
  EXPECT_EQ(q.limits().max_devices(), 8);
  EXPECT_EQ(q.usage().devices(), 6);
  // Decided once.
  s = Decide("root", req.id(), false, &decided);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("already approved by vera"));
  EXPECT_EQ(Decide("root", 999, true, &decided).error_code(), grpc::StatusCode::NOT_FOUND);

  // Denied: bob's quota stays unlimited; vera may not decide it.
  EXPECT_EQ(Decide("vera", bob_req.id(), false, &decided).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(Decide("root", bob_req.id(), false, &decided).ok());
  EXPECT_EQ(decided.state(), "denied");
  EXPECT_EQ(decided.decision_reason(), "ok by me");
  ASSERT_TRUE(GetQuota("bob", "user", "", &q).ok());
  EXPECT_FALSE(q.limits().has_max_devices());
  EXPECT_EQ(Decide("vera", bob_req.id(), true, &decided).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Malformed requests name the argument.
  s = GetQuota("root", "planet", "x", &q);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("subject: unknown \"planet\""));
  EXPECT_THAT(RequestQuota("ann", "user", "", -1, &req).error_message(), HasSubstr("negative"));

  // The trail: requests, decisions, the refusals.
  auto outcomes = [&](const std::string& action) {
    std::vector<std::string> out;
    const std::vector<AuditRecord> records = *audit_->Query({.action = action});
    for (const AuditRecord& r : records) out.push_back(r.outcome);
    return out;
  };
  EXPECT_EQ(outcomes("quota.request"), (std::vector<std::string>{"ok", "ok"}));
  EXPECT_EQ(outcomes("quota.approve"), (std::vector<std::string>{"denied", "ok", "denied"}));
  EXPECT_EQ(outcomes("quota.deny"), (std::vector<std::string>{"failed", "denied", "ok"}));
  EXPECT_TRUE(audit_->Verify()->ok);
}

// Nobody decides their own request but a system admin, whose override is recorded as such.
TEST_F(AdminServicesTest, ApprovalsAreNeverTheRequestersButASystemAdminsOverrideIsAudited) {
  kc::v1::QuotaRequestInfo own_team, own_user, root_own, decided;
  ASSERT_TRUE(RequestQuota("vera", "team", "vision", 64, &own_team).ok());
  ASSERT_TRUE(RequestQuota("root", "user", "vera", 8, &own_user).ok());
  ASSERT_TRUE(RequestQuota("root", "user", "root", 1000, &root_own).ok());
  for (const kc::v1::QuotaRequestInfo* r : {&own_team, &own_user}) {
    for (bool approve : {true, false}) {
      const grpc::Status s = Decide("vera", r->id(), approve, &decided);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << r->id();
      EXPECT_THAT(s.error_message(), HasSubstr("never on its own request"));
    }
  }
  // She does not even see them among the requests she may decide.
  kc::v1::ListQuotaRequestsResponse listed;
  ASSERT_TRUE(As("vera", quota_stub_.get(), &kc::v1::QuotaService::Stub::ListRequests,
                 kc::v1::ListQuotaRequestsRequest(), &listed)
                  .ok());
  EXPECT_EQ(listed.requests_size(), 0);
  ASSERT_TRUE(Decide("root", own_team.id(), true, &decided).ok());
  ASSERT_TRUE(Decide("root", root_own.id(), true, &decided).ok());
  std::vector<std::string> outcomes;
  const std::vector<AuditRecord> records = *audit_->Query({.action = "quota.approve"});
  for (const AuditRecord& r : records) outcomes.push_back(r.principal + " " + r.outcome);
  EXPECT_EQ(outcomes,
            (std::vector<std::string>{"vera denied", "vera denied", "root ok", "root override"}));
  kc::v1::QuotaInfo q;
  ASSERT_TRUE(GetQuota("root", "user", "root", &q).ok());
  EXPECT_EQ(q.limits().max_devices(), 1000);
}

// Tampers with the audit database behind the log's back, as someone with file access could.
void Tamper(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string all = "DROP TRIGGER audit_no_update; " + sql;
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, all.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
  sqlite3_free(err);
  sqlite3_close(db);
}

TEST_F(AdminServicesTest, AuditQueriesFilterAndShowEachCallerItsScope) {
  for (const auto& [who, action, resource] :
       std::vector<std::array<std::string, 3>>{{"ann", "job.submit", "job/1"},
                                               {"abe", "job.submit", "job/2"},
                                               {"bob", "job.cancel", "job/3"},
                                               {"ann", "quota.request", "quota-request/1"},
                                               {"kcd", "kcd.start", "roles/x"}}) {
    ASSERT_TRUE(AuditNow(audit_.get(), who, action, resource, "ok", "test").ok());
  }
  auto seen = [&](const std::string& user, kc::v1::AuditQueryRequest q) {
    kc::v1::AuditQueryResponse out;
    const grpc::Status s = Query(user, q, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> got;
    for (const kc::v1::AuditRecordInfo& r : out.records()) {
      got.push_back(r.principal() + " " + r.resource());
    }
    return got;
  };
  using V = std::vector<std::string>;
  kc::v1::AuditQueryRequest all;
  // Scopes: own; a resource admin's team members'; everything.
  EXPECT_EQ(seen("ann", all), (V{"ann job/1", "ann quota-request/1"}));
  EXPECT_EQ(seen("bob", all), (V{"bob job/3"}));
  EXPECT_EQ(seen("vera", all), (V{"ann job/1", "abe job/2", "ann quota-request/1"}));
  EXPECT_EQ(seen("olga", all).size(), 5u);
  // Filters.
  kc::v1::AuditQueryRequest q;
  q.set_principal("ann");
  EXPECT_EQ(seen("root", q), (V{"ann job/1", "ann quota-request/1"}));
  q.Clear();
  q.set_action("job.");
  EXPECT_EQ(seen("root", q), (V{"ann job/1", "abe job/2", "bob job/3"}));
  q.Clear();
  q.set_resource_prefix("quota-request/");
  EXPECT_EQ(seen("olga", q), (V{"ann quota-request/1"}));
  q.Clear();
  q.set_limit(2);
  EXPECT_EQ(seen("vera", q), (V{"ann job/1", "abe job/2"}));
  q.set_after_seq(2);
  EXPECT_EQ(seen("vera", q), (V{"ann quota-request/1"}));
  q.Clear();
  q.set_since_s(internal::WallSeconds() + 3600);
  EXPECT_EQ(seen("root", q), V{});
  q.Clear();
  q.set_limit(-1);
  kc::v1::AuditQueryResponse out;
  EXPECT_EQ(Query("root", q, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Verify over RPC: intact, then an edited record is found.
  kc::v1::AuditVerifyResponse v;
  ASSERT_TRUE(As("olga", audit_stub_.get(), &kc::v1::AuditService::Stub::Verify,
                 kc::v1::AuditVerifyRequest(), &v)
                  .ok());
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v.records(), 5);
  EXPECT_EQ(v.head(), audit_->head());
  Tamper(dir_.Path("audit.db"), "UPDATE audit SET principal = 'vera' WHERE seq = 3");
  ASSERT_TRUE(As("root", audit_stub_.get(), &kc::v1::AuditService::Stub::Verify,
                 kc::v1::AuditVerifyRequest(), &v)
                  .ok());
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.first_bad_seq(), 3);
  EXPECT_FALSE(v.problem().empty());
  // A submitter may not verify; the denial is recorded.
  EXPECT_EQ(As("ann", audit_stub_.get(), &kc::v1::AuditService::Stub::Verify,
               kc::v1::AuditVerifyRequest(), &v)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(audit_->Query({.action = "audit.verify"})->size(), 1u);
}

TEST_F(AdminServicesTest, ATopologyIsReplacedOnlyWhenItLoads) {
  kc::v1::TopologyInfo info;
  EXPECT_EQ(As("ann", topology_stub_.get(), &kc::v1::TopologyService::Stub::Get,
               kc::v1::GetTopologyRequest(), &info)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  kc::v1::PutTopologyRequest put;
  put.set_inventory(Inventory());
  kc::v1::PutTopologyResponse done;
  ASSERT_TRUE(
      As("root", topology_stub_.get(), &kc::v1::TopologyService::Stub::Put, put, &done).ok());
  EXPECT_THAT(done.note(), HasSubstr("applies it at its next pass"));
  EXPECT_EQ(done.topology().devices(), 32);
  EXPECT_EQ(File("topology.yaml"), Inventory());
  ASSERT_TRUE(As("ann", topology_stub_.get(), &kc::v1::TopologyService::Stub::Get,
                 kc::v1::GetTopologyRequest(), &info)
                  .ok());
  EXPECT_EQ(info.inventory(), Inventory());
  EXPECT_EQ(info.devices(), 32);
  EXPECT_THAT(std::vector<std::string>(info.hosts().begin(), info.hosts().end()),
              ::testing::ElementsAre("dgx00", "dgx01", "dgx02", "dgx03"));
  EXPECT_EQ(info.sha256(), internal::Sha256Hex(Inventory()));

  // A bad inventory is refused naming the line and key; the file stays as it was.
  std::string bad = Inventory();
  bad.replace(bad.find("count: 8"), 8, "count: -2");
  grpc::Status s = PutTopology("root", bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("topology.yaml:18:"));
  EXPECT_THAT(s.error_message(), HasSubstr("count"));
  EXPECT_EQ(File("topology.yaml"), Inventory());
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("topology.yaml.tmp")));
  // Only a system admin replaces it.
  EXPECT_EQ(PutTopology("vera", Inventory()).error_code(), grpc::StatusCode::PERMISSION_DENIED);

  std::vector<std::string> outcomes;
  const std::vector<AuditRecord> records = *audit_->Query({.action = "topology.write"});
  for (const AuditRecord& r : records) {
    outcomes.push_back(r.principal + " " + r.outcome);
  }
  EXPECT_EQ(outcomes, (std::vector<std::string>{"root ok", "root failed", "vera denied"}));
}

TEST_F(AdminServicesTest, PoolsAreListedOverTheTopologyAndReplacedWhenTheyFit) {
  kc::v1::ListPoolsResponse list;
  auto List = [&](const std::string& user) {
    list.Clear();
    return As(user, pool_stub_.get(), &kc::v1::PoolService::Stub::List, kc::v1::ListPoolsRequest(),
              &list);
  };
  grpc::Status s = List("ann");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("topology.yaml"));
  ASSERT_TRUE(PutTopology("root", Inventory()).ok());

  // No pools.yaml: the pool kcd's scheduler then uses, every device.
  ASSERT_TRUE(List("ann").ok());
  EXPECT_TRUE(list.defaults());
  std::map<std::string, int64_t> devices;
  for (const kc::v1::PoolInfo& p : list.pools()) devices[p.name()] = p.devices();
  EXPECT_EQ(devices, (std::map<std::string, int64_t>{{"all", 32}}));

  const std::string pools =
      "pools:\n"
      "  - {name: vision, classes: [normal], teams: [vision], hosts: \"dgx[00-01]\", lend: "
      "false}\n"
      "  - {name: rest, classes: [normal, preemptible], rest: true}\n";
  kc::v1::PutPoolsResponse put;
  ASSERT_TRUE(PutPools("root", pools, &put).ok());
  EXPECT_THAT(put.note(), HasSubstr("applies it at its next pass"));
  EXPECT_EQ(File("pools.yaml"), pools);
  ASSERT_TRUE(List("olga").ok());
  EXPECT_FALSE(list.defaults());
  ASSERT_EQ(list.pools_size(), 2);
  const kc::v1::PoolInfo& vision = list.pools(0);
  EXPECT_EQ(vision.name(), "vision");
  EXPECT_EQ(vision.devices(), 16);
  EXPECT_FALSE(vision.lend());
  EXPECT_THAT(std::vector<std::string>(vision.teams().begin(), vision.teams().end()),
              ::testing::ElementsAre("vision"));
  EXPECT_THAT(std::vector<std::string>(vision.hosts().begin(), vision.hosts().end()),
              ::testing::ElementsAre("dgx00", "dgx01"));
  EXPECT_THAT(
      std::vector<std::string>(list.pools(1).classes().begin(), list.pools(1).classes().end()),
      ::testing::ElementsAre("normal", "preemptible"));
  EXPECT_THAT(std::vector<std::string>(list.pools(1).hosts().begin(), list.pools(1).hosts().end()),
              ::testing::ElementsAre("dgx02", "dgx03"));

  // Pools that do not fit, or do not load, are refused naming the pool or line; the file
  // stays. A resource admin may not replace the whole file.
  s = PutPools("root", "pools:\n  - {name: huge, classes: [normal], devices: 64}\n", &put);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("huge"));
  s = PutPools("root", "pools:\n  - {name: x, colour: blue}\n", &put);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("pools.yaml:2:"));
  EXPECT_EQ(PutPools("vera", pools, &put).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(File("pools.yaml"), pools);

  // A topology the pools no longer fit (dgx01 gone) is refused, naming the pools file.
  std::string smaller = Inventory();
  smaller.replace(smaller.find("dgx[00-03]"), 10, "dgx00");
  s = PutTopology("root", smaller);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("pools.yaml does not fit the new topology"));
  EXPECT_EQ(File("topology.yaml"), Inventory());
}

}  // namespace
}  // namespace kc::api
