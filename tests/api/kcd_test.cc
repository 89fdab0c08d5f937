// A cluster as an admin brings it up: `kc init`, then kcd in its own process, reached over
// TLS with the cluster's CA and the admin's token; plaintext refused; the audit log records
// the starts, the stop and a change of the roles file.
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "api/audit_log.h"
#include "kc/v1/health.grpc.pb.h"
#include "kc/v1/jobs.grpc.pb.h"
#include "kc/v1/permission.grpc.pb.h"
#include "tests/support/child_guard.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using kc::testing::ChildGuard;
using kc::testing::TempDir;
using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// kcd in a child process; its first line of output gives the port.
struct Daemon {
  pid_t pid = -1;
  int port = 0;
  std::string first_line;
  FILE* out = nullptr;  // its standard output, open until it stops
  Daemon() = default;
  Daemon(const Daemon&) = delete;
  Daemon(Daemon&& o) noexcept
      : pid(o.pid),
        port(o.port),
        first_line(std::move(o.first_line)),
        out(std::exchange(o.out, nullptr)) {}
  ~Daemon() {
    if (out != nullptr) std::fclose(out);
  }
};

Daemon StartKcd(const std::string& dir, const std::string& listen = "127.0.0.1:0",
                bool insecure = false) {
  int fds[2];
  KC_CHECK(pipe(fds) == 0);
  Daemon d;
  d.pid = fork();
  KC_CHECK(d.pid >= 0);
  if (d.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    if (insecure) {
      execl(KCD_BINARY, KCD_BINARY, "--dir", dir.c_str(), "--listen", listen.c_str(),
            "--insecure-loopback", nullptr);
    } else {
      execl(KCD_BINARY, KCD_BINARY, "--dir", dir.c_str(), "--listen", listen.c_str(), nullptr);
    }
    _exit(127);
  }
  close(fds[1]);
  d.out = fdopen(fds[0], "r");
  char line[512] = {0};
  if (std::fgets(line, sizeof(line), d.out) != nullptr) d.first_line = line;
  const size_t colon = d.first_line.rfind(':', d.first_line.find(" ("));
  if (colon != std::string::npos) d.port = std::atoi(d.first_line.c_str() + colon + 1);
  return d;
}

int Stop(ChildGuard& child, pid_t pid) {
  kill(pid, SIGTERM);
  const int status = child.Reap();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(KcdTest, ServesOverTlsWithTheAdminsTokenAndAuditsItsLife) {
  TempDir dir("kc_kcd");
  const std::string cluster = dir.Path("cluster");
  kc::testing::KcRun init =
      kc::testing::RunKc(KC_BINARY, "init " + cluster + " --cluster t --admin root");
  ASSERT_EQ(init.exit_code, 0) << init.err;
  std::string token = Read(cluster + "/admin.token");
  token.erase(token.find_last_not_of('\n') + 1);

  Daemon d = StartKcd(cluster);
  ChildGuard child(d.pid);
  ASSERT_GT(d.port, 0) << d.first_line;
  EXPECT_THAT(d.first_line, HasSubstr("(TLS)"));
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = Read(cluster + "/tls/ca.pem");
  auto channel =
      grpc::CreateChannel(fmt::format("localhost:{}", d.port), grpc::SslCredentials(ssl));
  auto perms = kc::v1::PermissionService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    kc::v1::PermissionCheckRequest req;
    req.set_action("topology.write");
    req.mutable_resource()->set_kind("topology");
    kc::v1::PermissionCheckResponse resp;
    grpc::Status s = perms->Check(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(resp.allowed());
    EXPECT_EQ(resp.principal(), "root");
    EXPECT_EQ(resp.role(), "system_admin");
  }
  int64_t job_id = 0;
  {  // A job submitted through kcd is recorded (and survives the restart below).
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    kc::v1::SubmitJobRequest req;
    req.set_name("first");
    req.set_devices(2);
    kc::v1::JobInfo job;
    grpc::Status s = kc::v1::JobService::NewStub(channel)->Submit(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(job.phase(), "pending");
    EXPECT_EQ(job.owner(), "root");
    job_id = job.id();
  }
  {  // Health needs no token.
    grpc::ClientContext ctx;
    kc::v1::HealthCheckResponse resp;
    ASSERT_TRUE(kc::v1::Health::NewStub(channel)->Check(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.status(), kc::v1::HealthCheckResponse::SERVING);
  }
  {  // Plaintext to the TLS port does not get through.
    auto plain = kc::v1::Health::NewStub(grpc::CreateChannel(fmt::format("127.0.0.1:{}", d.port),
                                                             grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    kc::v1::HealthCheckResponse resp;
    EXPECT_FALSE(plain->Check(&ctx, {}, &resp).ok());
  }
  EXPECT_EQ(Stop(child, d.pid), 0);

  // A system admin edits the roles file and restarts kcd: recorded as a change.
  std::ofstream(cluster + "/roles.yaml", std::ios::app) << "# edited\n";
  Daemon again = StartKcd(cluster);
  ChildGuard child2(again.pid);
  ASSERT_GT(again.port, 0) << again.first_line;
  {
    auto jobs = kc::v1::JobService::NewStub(
        grpc::CreateChannel(fmt::format("localhost:{}", again.port), grpc::SslCredentials(ssl)));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    kc::v1::GetJobRequest req;
    req.set_id(job_id);
    kc::v1::JobInfo job;
    grpc::Status s = jobs->Get(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(job.name(), "first");
  }
  EXPECT_EQ(Stop(child2, again.pid), 0);
  Result<std::unique_ptr<AuditLog>> audit = AuditLog::Open(cluster + "/audit.db");
  ASSERT_TRUE(audit.ok());
  Result<std::vector<AuditRecord>> all = (*audit)->Query({});
  ASSERT_TRUE(all.ok());
  std::vector<std::string> seen;
  for (const AuditRecord& r : *all) seen.push_back(r.action + ":" + r.outcome);
  EXPECT_EQ(seen,
            (std::vector<std::string>{"cluster.init:ok", "kcd.start:ok", "job.submit:ok",
                                      "kcd.stop:ok", "kcd.start:roles changed", "kcd.stop:ok"}));
  EXPECT_TRUE((*audit)->Verify()->ok);
}

TEST(KcdTest, RefusesPlaintextOffLoopbackAndDirectoriesInitDidNotMake) {
  TempDir dir("kc_kcd_bad");
  const std::string cluster = dir.Path("cluster");
  ASSERT_EQ(kc::testing::RunKc(KC_BINARY, "init " + cluster).exit_code, 0);
  kc::testing::KcRun r = kc::testing::RunKc(
      KCD_BINARY, "--dir " + cluster + " --listen 0.0.0.0:0 --insecure-loopback");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("plaintext is allowed only on loopback"));
  r = kc::testing::RunKc(KCD_BINARY, "--dir " + dir.Path("nothing"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("not a cluster directory"));
  r = kc::testing::RunKc(KC_BINARY, "init " + cluster);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("already a cluster"));
  // Plaintext on loopback, when asked for.
  Daemon d = StartKcd(cluster, "127.0.0.1:0", /*insecure=*/true);
  ChildGuard child(d.pid);
  ASSERT_GT(d.port, 0) << d.first_line;
  auto plain = kc::v1::Health::NewStub(
      grpc::CreateChannel(fmt::format("127.0.0.1:{}", d.port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  kc::v1::HealthCheckResponse resp;
  EXPECT_TRUE(plain->Check(&ctx, {}, &resp).ok());
  EXPECT_EQ(Stop(child, d.pid), 0);
}

}  // namespace
}  // namespace kc::api
