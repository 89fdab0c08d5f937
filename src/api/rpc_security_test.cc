// kcd's RPC surface under hostile calls, over a real cluster directory and kcd in process:
// an oversized request, bytes that are not a protobuf, forged and revoked tokens against every
// method it serves, and a caller over a method's rate limit. After each, kcd keeps serving.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "api/audit_log.h"
#include "api/control_plane.h"
#include "api/internal/digest.h"
#include "api/tokens.h"
#include "base/file.h"
#include "kc/v1/audit.grpc.pb.h"
#include "kc/v1/health.grpc.pb.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/options.pb.h"
#include "tests/support/kcd_in_process.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;
namespace pb = google::protobuf;

constexpr auto kDeadline = std::chrono::seconds(30);

class RpcSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<InitResult> init = InitCluster({.dir = dir_.path(), .admin = "root"});
    ASSERT_TRUE(init.ok()) << init.status().message();
    admin_token_ = init->admin_token;
    Serve({.dir = dir_.path()});
  }
  // (Re)starts kcd with `options`.
  void Serve(const KcdOptions& options) {
    if (kcd_ != nullptr) kcd_->Shutdown();
    Result<kc::testing::KcdInProcess> kcd = kc::testing::StartKcdInProcess(options);
    ASSERT_TRUE(kcd.ok()) << kcd.status().message();
    kcd_ = std::move(kcd->kcd);
    channel_ = kcd->channel;
  }
  void TearDown() override {
    if (kcd_ != nullptr) kcd_->Shutdown();
  }

  void Prepare(grpc::ClientContext* ctx, const std::string& token) {
    ctx->set_deadline(std::chrono::system_clock::now() + kDeadline);
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  }
  // Calls `method` ("/kc.v1.JobService.Submit") with raw request bytes.
  grpc::Status Raw(const std::string& method, const std::string& bytes, const std::string& token) {
    grpc::GenericStub stub(channel_);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    Prepare(&ctx, token);
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status s) { done.set_value(std::move(s)); });
    return done.get_future().get();  // the context's deadline bounds the wait
  }
  // Health answers: kcd is still serving.
  bool Serving() {
    auto stub = kc::v1::Health::NewStub(channel_);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    kc::v1::HealthCheckResponse out;
    return stub->Check(&ctx, kc::v1::HealthCheckRequest(), &out).ok() &&
           out.status() == kc::v1::HealthCheckResponse::SERVING;
  }
  grpc::Status Submit(const std::string& spec, kc::v1::JobInfo* out) {
    auto stub = kc::v1::JobService::NewStub(channel_);
    grpc::ClientContext ctx;
    Prepare(&ctx, admin_token_);
    kc::v1::SubmitJobRequest r;
    r.set_name("j");
    r.set_spec(spec);
    r.set_devices(1);
    return stub->Submit(&ctx, r, out);
  }
  int64_t JobCount() {
    auto stub = kc::v1::JobService::NewStub(channel_);
    grpc::ClientContext ctx;
    Prepare(&ctx, admin_token_);
    kc::v1::ListJobsResponse out;
    EXPECT_TRUE(stub->List(&ctx, kc::v1::ListJobsRequest(), &out).ok());
    return out.jobs_size();
  }
  // Every method of every service kcd serves that needs a token, as "/SERVICE/METHOD".
  std::vector<std::string> GuardedMethods() {
    std::vector<std::string> out;
    for (const char* name : {"kc.v1.PermissionService", "kc.v1.JobService", "kc.v1.QuotaService",
                             "kc.v1.AuditService", "kc.v1.TopologyService", "kc.v1.PoolService"}) {
      const pb::ServiceDescriptor* s =
          pb::DescriptorPool::generated_pool()->FindServiceByName(name);
      EXPECT_NE(s, nullptr) << name;
      if (s == nullptr) continue;
      // kcd says it serves it.
      auto health = kc::v1::Health::NewStub(channel_);
      grpc::ClientContext ctx;
      Prepare(&ctx, "");
      kc::v1::HealthCheckRequest req;
      req.set_service(name);
      kc::v1::HealthCheckResponse resp;
      EXPECT_TRUE(health->Check(&ctx, req, &resp).ok()) << name;
      for (int i = 0; i < s->method_count(); ++i) {
        out.push_back(fmt::format("/{}/{}", name, s->method(i)->name()));
      }
    }
    return out;
  }

  kc::testing::TempDir dir_{"kc_rpcsec"};
  std::string admin_token_;
  std::unique_ptr<Kcd> kcd_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RpcSecurityTest, ARequestOverTheReceiveLimitIsRefusedAndKcdKeepsServing) {
  kc::v1::JobInfo job;
  const grpc::Status s = Submit(std::string(5 << 20, 'x'), &job);  // kcd takes 4 MiB
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(JobCount(), 0);
  EXPECT_TRUE(Serving());
  ASSERT_TRUE(Submit("", &job).ok());
  EXPECT_EQ(JobCount(), 1);
}

// The size kcd reads is its operator's to set (kcd --max-request-bytes).
TEST_F(RpcSecurityTest, TheReceiveLimitIsConfigurable) {
  Serve({.dir = dir_.path(), .max_request_bytes = 64 << 10});
  kc::v1::JobInfo job;
  EXPECT_EQ(Submit(std::string(100 << 10, 'x'), &job).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Submit("", &job).ok());
  EXPECT_EQ(Kcd::Start({.dir = dir_.path(), .listen = "127.0.0.1:0", .max_request_bytes = 10})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
}

TEST_F(RpcSecurityTest, BytesThatAreNotAProtobufAreRefusedAndKcdKeepsServing) {
  // Field 1, length-delimited, claiming 16 bytes and carrying 3; then a field numbered 0.
  for (const std::string& bytes : {std::string("\x0a\x10"
                                               "abc",
                                               5),
                                   std::string("\x00\x01", 2)}) {
    const grpc::Status s = Raw("/kc.v1.JobService/Submit", bytes, admin_token_);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  EXPECT_EQ(JobCount(), 0);
  EXPECT_TRUE(Serving());
  // A well-formed request over the same path goes through.
  kc::v1::SubmitJobRequest r;
  r.set_name("raw");
  EXPECT_TRUE(Raw("/kc.v1.JobService/Submit", r.SerializeAsString(), admin_token_).ok());
  EXPECT_EQ(JobCount(), 1);
}

// A forged token, and a token replayed after its user's tokens were revoked, are refused by
// every method kcd serves, before any handler runs.
TEST_F(RpcSecurityTest, EveryMethodRefusesForgedAndRevokedTokens) {
  const std::vector<std::string> methods = GuardedMethods();
  ASSERT_GE(methods.size(), 15u);
  std::string forged = admin_token_;
  forged.back() = forged.back() == 'a' ? 'b' : 'a';
  // A second token of the admin, used once, then revoked (with the first) in kcd's database.
  std::unique_ptr<TokenStore> tokens = std::move(*TokenStore::Open(dir_.Path("kcd.db")));
  const std::string replayed = tokens->Issue("root", 3600, internal::WallSeconds())->token;
  ASSERT_EQ(Raw("/kc.v1.JobService/List", "", replayed).error_code(), grpc::StatusCode::OK);
  ASSERT_EQ(*tokens->RevokeAll("root", internal::WallSeconds()), 2);
  for (const std::string& m : methods) {
    for (const std::string& token : {forged, replayed, std::string()}) {
      const grpc::Status s = Raw(m, "", token);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << m << ": " << s.error_message();
    }
  }
  EXPECT_TRUE(Serving());
  // The refusals are in the audit log, as many as one caller's refusals may write at once
  // (RpcGuardOptions::refusal_audit_burst): a flood of them costs kcd that many fsyncs, not
  // one each (read by a second connection: kcd holds it open).
  std::unique_ptr<AuditLog> audit = std::move(*AuditLog::OpenExisting(dir_.Path("audit.db")));
  int refused = 0;
  const std::vector<AuditRecord> records = *audit->Query({.limit = 1 << 30});
  for (const AuditRecord& r : records) {
    refused += r.resource == "rpc" && r.outcome == "denied";
  }
  EXPECT_GE(refused, 20);
  EXPECT_LT(refused, static_cast<int>(methods.size()) * 3);
  EXPECT_TRUE(audit->Verify()->ok);
}

// Calls past a method's annotated limit get the annotated RESOURCE_EXHAUSTED; kcd keeps serving
// others. AuditService.Verify allows one call a second, two at once.
TEST_F(RpcSecurityTest, CallsOverAMethodsRateLimitAreResourceExhausted) {
  const pb::MethodDescriptor* md =
      pb::DescriptorPool::generated_pool()->FindMethodByName("kc.v1.AuditService.Verify");
  ASSERT_NE(md, nullptr);
  const kc::v1::RateLimit limit = md->options().GetExtension(kc::v1::rate_limit);
  ASSERT_EQ(limit.burst(), 2u);
  bool declared = false;
  for (int i = 0; i < md->options().ExtensionSize(kc::v1::errors); ++i) {
    declared |=
        md->options().GetExtension(kc::v1::errors, i) == kc::v1::ERROR_CODE_RESOURCE_EXHAUSTED;
  }
  ASSERT_TRUE(declared);
  // Calls come far faster than one a second, so one of the first few is refused; the bound
  // only keeps a broken limit from looping forever.
  auto stub = kc::v1::AuditService::NewStub(channel_);
  grpc::Status refused;
  int ok = 0;
  for (int i = 0; i < 1000 && refused.ok(); ++i) {
    grpc::ClientContext ctx;
    Prepare(&ctx, admin_token_);
    kc::v1::AuditVerifyResponse out;
    grpc::Status s = stub->Verify(&ctx, kc::v1::AuditVerifyRequest(), &out);
    if (s.ok()) {
      ++ok;
    } else {
      refused = s;
    }
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("rate limit of 1 calls/s per caller"));
  EXPECT_GE(ok, 2);
  EXPECT_TRUE(Serving());
  kc::v1::JobInfo job;
  EXPECT_TRUE(Submit("", &job).ok());  // another method's bucket
}

}  // namespace
}  // namespace kc::api
