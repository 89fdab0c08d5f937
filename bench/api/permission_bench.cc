// Latency of the permission check over RPC on loopback, uncached: a PermissionService on
// 127.0.0.1 (plaintext, as kcd on loopback in development), one client making sequential
// Check calls with a bearer token, each authenticated against the token store (SQLite) and
// answered from the permission table. Beside it, the same check in-process, as the floor.
//
//   build/release/bench/api/kc_permission_bench [--calls 20000]
//
// Prints p50 / p99 / max of both and the RPC's p99 against the goal (< 1 ms).
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "api/permission_service.h"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

void Report(const char* what, const std::vector<double>& us) {
  fmt::print("{:<28} p50 {:8.1f} us   p99 {:8.1f} us   max {:8.1f} us   ({} calls)\n", what,
             Percentile(us, 0.5), Percentile(us, 0.99), *std::max_element(us.begin(), us.end()),
             us.size());
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 20000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--calls") == 0) calls = std::atoi(argv[i + 1]);
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kc_permission_bench_{}", getpid());
  fs::create_directories(dir);
  auto tokens = kc::api::TokenStore::Open((dir / "kcd.db").string());
  auto roles = kc::api::LoadRolesString(
      "cluster: bench\nusers:\n  - {name: root, role: system_admin}\n"
      "  - {name: ann, role: submitter, teams: [vision]}\nteams:\n  - {name: vision}\n",
      "bench roles");
  if (!tokens.ok() || !roles.ok()) {
    fmt::print(stderr, "setup failed\n");
    return 1;
  }
  kc::api::RpcGuard guard({.tokens = tokens->get(), .roles = &*roles});
  kc::api::PermissionServiceImpl service(&guard, nullptr);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  auto stub = kc::v1::PermissionService::NewStub(
      grpc::CreateChannel(fmt::format("127.0.0.1:{}", port), grpc::InsecureChannelCredentials()));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string token = (*tokens)->Issue("ann", 3600, now)->token;

  kc::v1::PermissionCheckRequest req;
  req.set_action("checkpoint.write");
  req.mutable_resource()->set_kind("path");
  req.mutable_resource()->set_id("/ckpt/job-7");
  req.mutable_resource()->set_owner("ann");
  req.mutable_resource()->set_team("vision");
  std::vector<double> rpc_us, local_us;
  for (int i = 0; i < calls + calls / 10; ++i) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    kc::v1::PermissionCheckResponse resp;
    const auto t0 = Clock::now();
    grpc::Status s = stub->Check(&ctx, req, &resp);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!s.ok() || !resp.allowed()) {
      fmt::print(stderr, "check failed: {}\n", s.error_message());
      return 1;
    }
    if (i >= calls / 10) rpc_us.push_back(us);  // the first tenth warms up
  }
  const kc::api::Principal ann = *roles->PrincipalFor("ann");
  for (int i = 0; i < calls; ++i) {
    const auto t0 = Clock::now();
    kc::api::CheckResult r =
        kc::api::Check(ann, kc::api::Action::kCheckpointWrite,
                       {.kind = "path", .id = "/ckpt/job-7", .owner = "ann", .team = "vision"});
    local_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!r.allowed) return 1;
  }
  server->Shutdown();
  fs::remove_all(dir);
  Report("check over RPC (loopback)", rpc_us);
  Report("check in-process", local_us);
  fmt::print("goal: p99 over RPC < 1 ms: {}\n",
             Percentile(rpc_us, 0.99) < 1000 ? "met" : "NOT met");
  return 0;
}
