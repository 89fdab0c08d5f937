#include "api/permission_service.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "api/internal/digest.h"
#include "kc/v1/health.pb.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

constexpr char kRoles[] = R"(
cluster: c
users:
  - {name: root, role: system_admin}
  - {name: vera, role: resource_admin, teams: [vision]}
  - {name: ann, role: submitter, teams: [vision]}
  - {name: olga, role: observer}
teams:
  - {name: vision, admins: [vera]}
)";

// A permission server on loopback (plaintext: tests only) and tokens for its users.
class PermissionServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<TokenStore>> t = TokenStore::Open(dir_.Path("kcd.db"));
    ASSERT_TRUE(t.ok()) << t.status().message();
    tokens_ = std::move(*t);
    Result<RolesConfig> roles = LoadRolesString(kRoles, "roles.yaml");
    ASSERT_TRUE(roles.ok()) << roles.status().message();
    roles_ = *roles;
    Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(dir_.Path("audit.db"));
    ASSERT_TRUE(audit.ok()) << audit.status().message();
    audit_ = std::move(*audit);
    guard_ = std::make_unique<RpcGuard>(
        RpcGuardOptions{.tokens = tokens_.get(), .roles = &roles_, .audit = audit_.get()});
    service_ = std::make_unique<PermissionServiceImpl>(guard_.get(), audit_.get());
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = kc::v1::PermissionService::NewStub(
        grpc::CreateChannel(fmt::format("127.0.0.1:{}", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  std::string Token(const std::string& user, double ttl = 3600) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    return tokens_->Issue(user, ttl, now)->token;
  }
  grpc::Status Ask(const std::string& token, const std::string& action,
                   const kc::v1::ResourceRef& r, kc::v1::PermissionCheckResponse* out) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    kc::v1::PermissionCheckRequest req;
    req.set_action(action);
    *req.mutable_resource() = r;
    return stub_->Check(&ctx, req, out);
  }
  static kc::v1::ResourceRef Job(const std::string& owner, const std::string& team) {
    kc::v1::ResourceRef r;
    r.set_kind("job");
    r.set_id("7");
    r.set_owner(owner);
    r.set_team(team);
    return r;
  }

  testing::TempDir dir_{"kc_permission"};
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<AuditLog> audit_;
  RolesConfig roles_;
  std::unique_ptr<RpcGuard> guard_;
  std::unique_ptr<PermissionServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<kc::v1::PermissionService::Stub> stub_;
};

TEST_F(PermissionServiceTest, AnswersFromTheTableForTheTokensUser) {
  kc::v1::PermissionCheckResponse r;
  ASSERT_TRUE(Ask(Token("ann"), "job.cancel", Job("ann", "vision"), &r).ok());
  EXPECT_TRUE(r.allowed());
  EXPECT_EQ(r.principal(), "ann");
  EXPECT_EQ(r.role(), "submitter");
  ASSERT_TRUE(Ask(Token("ann"), "job.cancel", Job("bob", "vision"), &r).ok());
  EXPECT_FALSE(r.allowed());
  EXPECT_THAT(r.reason(), HasSubstr("only its own; this belongs to bob"));
  ASSERT_TRUE(Ask(Token("vera"), "job.cancel", Job("bob", "vision"), &r).ok());
  EXPECT_TRUE(r.allowed());
  ASSERT_TRUE(Ask(Token("olga"), "job.cancel", Job("ann", "vision"), &r).ok());
  EXPECT_FALSE(r.allowed());
  ASSERT_TRUE(Ask(Token("olga"), "job.get", Job("ann", "vision"), &r).ok());
  EXPECT_TRUE(r.allowed());
  // The two denials are in the audit log, and the chain holds.
  Result<std::vector<AuditRecord>> denied = audit_->Query({.action = "job.cancel"});
  ASSERT_TRUE(denied.ok());
  ASSERT_EQ(denied->size(), 2u);
  EXPECT_EQ((*denied)[0].principal, "ann");
  EXPECT_EQ((*denied)[0].outcome, "denied");
  EXPECT_EQ((*denied)[0].resource, "job/7");
  EXPECT_EQ((*denied)[1].principal, "olga");
  EXPECT_TRUE(audit_->Verify()->ok);
}

TEST_F(PermissionServiceTest, RefusesCallsWithoutAValidToken) {
  kc::v1::PermissionCheckResponse r;
  grpc::Status s = Ask("", "job.get", Job("ann", "vision"), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("no bearer token"));
  std::string forged = Token("ann");
  forged.back() = forged.back() == 'a' ? 'b' : 'a';
  EXPECT_EQ(Ask(forged, "job.get", Job("ann", "vision"), &r).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(Ask(Token("ann", 1e-9), "job.get", Job("ann", "vision"), &r).error_message(),
              HasSubstr("expired"));
  s = Ask(Token("mallory"), "job.get", Job("ann", "vision"), &r);  // a token, but no role
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("not in the cluster's roles file"));
  // A revoked right takes effect at the next check: nothing is cached.
  const std::string t = Token("ann");
  ASSERT_TRUE(Ask(t, "job.get", Job("ann", "vision"), &r).ok());
  ASSERT_TRUE(tokens_->RevokeAll("ann", internal::WallSeconds()).ok());
  EXPECT_EQ(Ask(t, "job.get", Job("ann", "vision"), &r).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Every refusal was audited, with its reason.
  Result<std::vector<AuditRecord>> refused =
      audit_->Query({.action = "kc.v1.PermissionService.Check"});
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->size(), 5u);
  EXPECT_THAT(refused->back().reason, HasSubstr("revoked"));
}

TEST_F(PermissionServiceTest, AnUnknownActionIsTheDeclaredInvalidArgument) {
  kc::v1::PermissionCheckResponse r;
  grpc::Status s = Ask(Token("root"), "job.obliterate", Job("ann", "vision"), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown \"job.obliterate\""));
}

// The guard alone: an undeclared error becomes INTERNAL, and the annotated limit holds.
TEST_F(PermissionServiceTest, TheGuardMapsUndeclaredErrorsAndEnforcesTheLimit) {
  // Link the Health descriptors into this binary (kcd links them by serving Health).
  ASSERT_NE(kc::v1::HealthCheckRequest::descriptor(), nullptr);
  FakeClock clock;
  RpcGuard guard({.tokens = tokens_.get(), .roles = &roles_, .clock = &clock});
  grpc::ServerContext ctx;  // no client: as a handler sees it before any metadata
  // kc.v1.Health.Check is public, 10 calls/s per caller, burst 20.
  int ok = 0;
  for (int i = 0; i < 25; ++i) {
    grpc::Status s =
        guard.Serve(&ctx, "kc.v1.Health.Check", [](const Principal&) { return OkStatus(); });
    if (s.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(s.error_message(), HasSubstr("over the rate limit of 10 calls/s per caller"));
    }
  }
  EXPECT_EQ(ok, 20);
  clock.Advance(std::chrono::seconds(1));  // ten more tokens
  grpc::Status s = guard.Serve(&ctx, "kc.v1.Health.Check",
                               [](const Principal&) { return DataLossError("oops"); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);  // not in Health.Check's errors
  s = guard.Serve(&ctx, "kc.v1.Health.Check",
                  [](const Principal&) { return NotFoundError("no such service"); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);  // declared
  EXPECT_EQ(guard.Serve(&ctx, "kc.v1.Nope.Nothing", [](const Principal&) { return OkStatus(); })
                .error_code(),
            grpc::StatusCode::INTERNAL);
}

}  // namespace
}  // namespace kc::api
