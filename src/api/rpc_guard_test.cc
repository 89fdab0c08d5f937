// The generic RPC layer under a flood, on a fake clock: refusals reach the audit log at a
// bounded rate per caller (the peer's address, whatever port each connection comes from), and
// one caller's calls in progress are bounded.
#include "api/rpc_guard.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "api/permission_service.h"
#include "base/notification.h"
#include "kc/v1/health.grpc.pb.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

// Health answers once the test lets it: a call that stays in progress.
class HeldHealth final : public kc::v1::Health::Service {
 public:
  explicit HeldHealth(RpcGuard* guard) : guard_(guard) {}
  grpc::Status Check(grpc::ServerContext* context, const kc::v1::HealthCheckRequest*,
                     kc::v1::HealthCheckResponse*) override {
    return guard_->Serve(context, "kc.v1.Health.Check", [&](const Principal&) {
      if (!entered_.HasBeenNotified()) entered_.Notify();
      release_.WaitForNotification();
      return OkStatus();
    });
  }
  Notification entered_, release_;

 private:
  RpcGuard* guard_;  // not owned; the test outlives the server
};

class RpcGuardTest : public ::testing::Test {
 protected:
  void Start(RpcGuardOptions options) {
    tokens_ = std::move(*TokenStore::Open(dir_.Path("kcd.db")));
    audit_ = std::move(*AuditLog::Open(dir_.Path("audit.db")));
    roles_ = *LoadRolesString("cluster: c\nusers:\n  - {name: root, role: system_admin}\n",
                              "roles.yaml");
    options.tokens = tokens_.get();
    options.roles = &roles_;
    options.clock = &clock_;
    options.audit = audit_.get();
    guard_ = std::make_unique<RpcGuard>(options);
    permission_ = std::make_unique<PermissionServiceImpl>(guard_.get(), audit_.get());
    health_ = std::make_unique<HeldHealth>(guard_.get());
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(permission_.get());
    b.RegisterService(health_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (health_ != nullptr && !health_->release_.HasBeenNotified()) health_->release_.Notify();
    if (server_ != nullptr) server_->Shutdown();
  }
  // A channel of its own: a connection of its own, from a port of its own.
  std::shared_ptr<grpc::Channel> NewConnection() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(fmt::format("127.0.0.1:{}", port_),
                                     grpc::InsecureChannelCredentials(), args);
  }
  grpc::Status CheckWithForgedToken(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = kc::v1::PermissionService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer kc_" + std::string(64, '0'));
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    kc::v1::PermissionCheckRequest req;
    req.set_action("job.list");
    kc::v1::PermissionCheckResponse resp;
    return stub->Check(&ctx, req, &resp);
  }
  std::vector<AuditRecord> Refusals() {
    std::vector<AuditRecord> out;
    const std::vector<AuditRecord> all = *audit_->Query({.limit = 1 << 30});
    for (const AuditRecord& r : all) {
      if (r.resource == "rpc" && r.outcome == "denied") out.push_back(r);
    }
    return out;
  }

  kc::testing::TempDir dir_{"kc_rpcguard"};
  FakeClock clock_;
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<AuditLog> audit_;
  RolesConfig roles_;
  std::unique_ptr<RpcGuard> guard_;
  std::unique_ptr<PermissionServiceImpl> permission_;
  std::unique_ptr<HeldHealth> health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST(PeerAddressTest, DropsThePortAndKeepsTheHost) {
  EXPECT_EQ(PeerAddress("ipv4:10.0.0.7:51234"), "ipv4:10.0.0.7");
  EXPECT_EQ(PeerAddress("ipv6:[::1]:8080"), "ipv6:[::1]");
  EXPECT_EQ(PeerAddress("unix:/run/kcd.sock"), "unix:/run/kcd.sock");
  EXPECT_EQ(PeerAddress(""), "");
}

// Fifty calls with a forged token, each over a connection of its own, as a flood of new
// connections comes: the first refusal_audit_burst are recorded, the rest counted; time passes
// and the next record says how many were left out. Every call is still refused.
TEST_F(RpcGuardTest, RefusalsOfOneAddressReachTheAuditLogAtABoundedRate) {
  Start({.refusal_audits_per_second = 1, .refusal_audit_burst = 5});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(CheckWithForgedToken(NewConnection()).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(Refusals().size(), 5u);
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_EQ(CheckWithForgedToken(NewConnection()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const std::vector<AuditRecord> refusals = Refusals();
  ASSERT_EQ(refusals.size(), 6u);
  EXPECT_THAT(refusals.back().reason, HasSubstr("45 more refusals of peer ipv4:127.0.0.1"));
  EXPECT_TRUE(audit_->Verify()->ok);
}

// A caller with as many calls in progress as it may have gets RESOURCE_EXHAUSTED for the next,
// until one ends; others are not held up.
TEST_F(RpcGuardTest, OneCallersCallsInProgressAreBounded) {
  Start({.max_calls_in_flight_per_caller = 1});
  auto channel = NewConnection();
  auto call = [&] {
    auto stub = kc::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    kc::v1::HealthCheckResponse out;
    return stub->Check(&ctx, kc::v1::HealthCheckRequest(), &out);
  };
  std::future<grpc::Status> held = std::async(std::launch::async, call);
  health_->entered_.WaitForNotification();
  const grpc::Status second = call();
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.error_message(), HasSubstr("calls in progress"));
  health_->release_.Notify();
  EXPECT_TRUE(held.get().ok());
  EXPECT_TRUE(call().ok());
}

}  // namespace
}  // namespace kc::api
