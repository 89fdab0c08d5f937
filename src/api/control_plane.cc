#include "api/control_plane.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "api/agent_service.h"
#include "api/audit_log.h"
#include "api/audit_service.h"
#include "api/cluster_config_service.h"
#include "api/dispatcher.h"
#include "api/internal/digest.h"
#include "api/job_service.h"
#include "api/metrics.h"
#include "api/permission_service.h"
#include "api/plan_service.h"
#include "api/plan_store.h"
#include "api/quota_service.h"
#include "api/roles_file.h"
#include "api/rpc_guard.h"
#include "api/tls.h"
#include "api/tokens.h"
#include "base/file.h"
#include "hal/inventory.h"
#include "kc/v1/health.grpc.pb.h"

namespace kc::api {
namespace {

using internal::Sha256Hex;
using internal::WallSeconds;

namespace fs = std::filesystem;

// Writes a file durably, created with `mode` permissions (never wider, not even briefly).
Status WriteFile(const fs::path& path, std::string_view text, mode_t mode) {
  return WriteFileDurably(path.string(), text, {.mode = mode});
}

// The address the stores of runs across hosts are served on: the host of --listen, when it is
// a numeric address the hosts can be told (not a wildcard); "" otherwise.
std::string StoreAddress(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  in6_addr any6{};
  in_addr any4{};
  const bool v4 = inet_pton(AF_INET, host.c_str(), &any4) == 1;
  const bool v6 = inet_pton(AF_INET6, host.c_str(), &any6) == 1;
  if ((!v4 && !v6) || host == "0.0.0.0" || host == "::") return "";
  return host;
}

bool IsLoopback(const std::string& listen) {
  const std::string host = listen.substr(0, listen.rfind(':'));
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]";
}

// Health: public (no token), for liveness probes. Knows the services kcd registered.
class HealthService final : public kc::v1::Health::Service {
 public:
  HealthService(RpcGuard* guard, std::vector<std::string> served)
      : guard_(guard), served_(std::move(served)) {}
  grpc::Status Check(grpc::ServerContext* context, const kc::v1::HealthCheckRequest* request,
                     kc::v1::HealthCheckResponse* response) override {
    return guard_->Serve(context, "kc.v1.Health.Check", [&](const Principal&) -> Status {
      const std::string& name = request->service();
      if (!name.empty() && std::find(served_.begin(), served_.end(), name) == served_.end()) {
        return NotFoundError(fmt::format("service {}: not served here", request->service()));
      }
      response->set_status(kc::v1::HealthCheckResponse::SERVING);
      return OkStatus();
    });
  }

 private:
  RpcGuard* guard_;                        // not owned; the Kcd that owns both outlives the service
  const std::vector<std::string> served_;  // full names, kc.v1.Health included
};

}  // namespace

Result<InitResult> InitCluster(const InitOptions& o) {
  const fs::path dir(o.dir);
  if (fs::exists(dir / "roles.yaml")) {
    return AlreadyExistsError(
        fmt::format("{}: already a cluster (roles.yaml exists); nothing was changed", o.dir));
  }
  std::string inventory;
  if (!o.inventory_path.empty()) {
    KC_ASSIGN_OR_RETURN(hal::TopologySpec spec, hal::LoadInventory(o.inventory_path));
    KC_ASSIGN_OR_RETURN(inventory, ReadWholeFile(o.inventory_path));
  }
  std::error_code ec;
  fs::create_directories(dir / "tls", ec);
  if (ec) return UnavailableError(fmt::format("{}: cannot create: {}", o.dir, ec.message()));
  KC_ASSIGN_OR_RETURN(TlsFiles tls, MakeClusterTls(o.cluster, o.hosts, o.tls_days));
  KC_RETURN_IF_ERROR(WriteFile(dir / "tls/ca.pem", tls.ca_cert_pem, 0644));
  KC_RETURN_IF_ERROR(WriteFile(dir / "tls/ca.key", tls.ca_key_pem, 0600));
  KC_RETURN_IF_ERROR(WriteFile(dir / "tls/server.pem", tls.server_cert_pem, 0644));
  KC_RETURN_IF_ERROR(WriteFile(dir / "tls/server.key", tls.server_key_pem, 0600));
  if (!inventory.empty()) KC_RETURN_IF_ERROR(WriteFile(dir / "topology.yaml", inventory, 0644));
  KC_ASSIGN_OR_RETURN(std::unique_ptr<TokenStore> tokens,
                      TokenStore::Open((dir / "kcd.db").string()));
  KC_ASSIGN_OR_RETURN(IssuedToken token, tokens->Issue(o.admin, o.token_ttl_s, WallSeconds()));
  KC_RETURN_IF_ERROR(WriteFile(dir / "admin.token", token.token + "\n", 0600));
  KC_ASSIGN_OR_RETURN(std::unique_ptr<AuditLog> audit, AuditLog::Open((dir / "audit.db").string()));
  KC_RETURN_IF_ERROR(
      AuditNow(audit.get(), o.admin, "cluster.init", "cluster/" + o.cluster, "ok", "kc init"));
  // The roles file last: its presence marks a complete directory.
  const std::string roles = fmt::format(
      "# Who is who on cluster {} (docs/operations/roles.md). Edit as a system admin, then\n"
      "# restart kcd; kcd records every change of this file in the audit log.\n"
      "cluster: {}\nusers:\n  - {{name: {}, role: system_admin}}\nteams: []\n",
      o.cluster, o.cluster, o.admin);
  KC_RETURN_IF_ERROR(WriteFile(dir / "roles.yaml", roles, 0644));
  return InitResult{.admin_token = token.token};
}

struct Kcd::Impl {
  KcdOptions options;
  RolesConfig roles;
  std::unique_ptr<TokenStore> tokens;
  std::unique_ptr<JobStore> jobs;
  std::unique_ptr<QuotaStore> quotas;
  std::unique_ptr<AuditLog> audit;
  std::unique_ptr<RpcGuard> guard;
  std::unique_ptr<Dispatcher> dispatcher;
  std::unique_ptr<AgentServiceImpl> agent_service;
  std::unique_ptr<PermissionServiceImpl> permission;
  std::unique_ptr<JobServiceImpl> job_service;
  // The admin services (issue 10): quotas, audit, the topology and pools files.
  std::unique_ptr<ClusterDir> cluster_dir;
  std::unique_ptr<QuotaServiceImpl> quota_service;
  std::unique_ptr<AuditServiceImpl> audit_service;
  std::unique_ptr<TopologyServiceImpl> topology_service;
  std::unique_ptr<PoolServiceImpl> pool_service;
  std::unique_ptr<PlanStore> plans;
  std::unique_ptr<PlanServiceImpl> plan_service;
  std::unique_ptr<HealthService> health;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::unique_ptr<MetricsServer> metrics;
  bool stopped = false;

  // The metrics page: jobs by phase, the dispatcher's, the permission checks' latency.
  std::string Metrics() const {
    std::string out;
    std::vector<MetricSample> phases;
    const std::map<JobPhase, int64_t> counts = jobs->CountByPhase().value_or({});
    for (JobPhase p :
         {JobPhase::kPending, JobPhase::kApprovalRequired, JobPhase::kQueued, JobPhase::kRunning,
          JobPhase::kPaused, JobPhase::kSucceeded, JobPhase::kFailed, JobPhase::kCancelled}) {
      auto c = counts.find(p);
      phases.push_back({.labels = {{"phase", std::string(JobPhaseName(p))}},
                        .value = double(c == counts.end() ? 0 : c->second)});
    }
    AppendMetric(&out, "kc_jobs", "gauge", "Jobs by phase", phases);
    dispatcher->AppendMetrics(&out);
    permission->latency().Append(&out, "kc_permission_check_seconds",
                                 "How long PermissionService.Check takes to serve");
    if (options.more_metrics) out += options.more_metrics();
    return out;
  }
};

Kcd::Kcd(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Kcd::~Kcd() { Shutdown(); }

Result<std::unique_ptr<Kcd>> Kcd::Start(const KcdOptions& o) {
  const fs::path dir(o.dir);
  if (o.max_jobs_per_user < 1 || o.max_log_bytes_per_job < 1 || o.max_request_bytes < 1024 ||
      o.max_calls_in_flight_per_caller < 1 || o.max_streams_per_connection < 1 ||
      !(o.max_connection_idle_s > 0) || o.max_threads < 4) {
    return InvalidArgumentError(
        "kcd: limits must be positive (a request size of at least 1024 bytes, at least 4 "
        "threads)");
  }
  if (!fs::exists(dir / "roles.yaml")) {
    return NotFoundError(fmt::format("{}: not a cluster directory (run kc init {})", o.dir, o.dir));
  }
  if (o.insecure_loopback && !IsLoopback(o.listen)) {
    return InvalidArgumentError(fmt::format(
        "--insecure-loopback: plaintext is allowed only on loopback, not on {}", o.listen));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  const std::string roles_path = (dir / "roles.yaml").string();
  KC_ASSIGN_OR_RETURN(impl->roles, LoadRolesFile(roles_path));
  KC_ASSIGN_OR_RETURN(std::string roles_text, ReadWholeFile(roles_path));
  KC_ASSIGN_OR_RETURN(impl->tokens, TokenStore::Open((dir / "kcd.db").string()));
  KC_ASSIGN_OR_RETURN(impl->jobs, JobStore::Open((dir / "kcd.db").string(),
                                                 {.max_log_bytes = o.max_log_bytes_per_job}));
  KC_ASSIGN_OR_RETURN(impl->quotas, QuotaStore::Open((dir / "kcd.db").string()));
  KC_ASSIGN_OR_RETURN(impl->plans, PlanStore::Open((dir / "kcd.db").string()));
  KC_ASSIGN_OR_RETURN(impl->audit, AuditLog::Open((dir / "audit.db").string()));
  // A change of the roles file between starts is recorded as such.
  const std::string roles_hash = Sha256Hex(roles_text);
  KC_ASSIGN_OR_RETURN(std::vector<AuditRecord> starts,
                      impl->audit->Query({.action = "kcd.start", .limit = 1 << 30}));
  const bool changed = !starts.empty() && starts.back().resource != "roles/" + roles_hash;
  KC_RETURN_IF_ERROR(AuditNow(impl->audit.get(), "kcd", "kcd.start", "roles/" + roles_hash,
                              changed ? "roles changed" : "ok",
                              fmt::format("listening on {}", o.listen)));
  impl->guard = std::make_unique<RpcGuard>(
      RpcGuardOptions{.tokens = impl->tokens.get(),
                      .roles = &impl->roles,
                      .audit = impl->audit.get(),
                      .max_calls_in_flight_per_caller = o.max_calls_in_flight_per_caller});
  impl->permission = std::make_unique<PermissionServiceImpl>(impl->guard.get(), impl->audit.get());
  KC_ASSIGN_OR_RETURN(impl->dispatcher,
                      Dispatcher::Start({.dir = o.dir,
                                         .jobs = impl->jobs.get(),
                                         .tokens = impl->tokens.get(),
                                         .audit = impl->audit.get(),
                                         .roles = &impl->roles,
                                         .plans = impl->plans.get(),
                                         .heartbeat_period_s = o.heartbeat_period_s,
                                         .lost_after_s = o.agent_lost_after_s,
                                         .check_period_s = o.check_period_s,
                                         .store_address = StoreAddress(o.listen)}));
  impl->agent_service = std::make_unique<AgentServiceImpl>(
      impl->guard.get(), impl->dispatcher.get(), impl->audit.get());
  impl->job_service = std::make_unique<JobServiceImpl>(
      impl->guard.get(), &impl->roles, impl->jobs.get(), impl->quotas.get(), impl->audit.get(),
      impl->dispatcher.get(), JobServiceOptions{.max_active_jobs_per_user = o.max_jobs_per_user});
  impl->plan_service =
      std::make_unique<PlanServiceImpl>(impl->guard.get(), impl->jobs.get(), impl->plans.get(),
                                        impl->audit.get(), impl->dispatcher.get());
  impl->cluster_dir = std::make_unique<ClusterDir>(o.dir);
  impl->quota_service = std::make_unique<QuotaServiceImpl>(
      impl->guard.get(), &impl->roles, impl->quotas.get(), impl->jobs.get(), impl->audit.get());
  impl->audit_service =
      std::make_unique<AuditServiceImpl>(impl->guard.get(), &impl->roles, impl->audit.get());
  impl->topology_service = std::make_unique<TopologyServiceImpl>(
      impl->guard.get(), impl->cluster_dir.get(), impl->audit.get());
  impl->pool_service = std::make_unique<PoolServiceImpl>(impl->guard.get(), impl->cluster_dir.get(),
                                                         impl->audit.get());
  // Everything kcd serves, by full name; Health answers for exactly these.
  const std::pair<const char*, grpc::Service*> services[] = {
      {kc::v1::PermissionService::service_full_name(), impl->permission.get()},
      {kc::v1::JobService::service_full_name(), impl->job_service.get()},
      {kc::v1::AgentService::service_full_name(), impl->agent_service.get()},
      {kc::v1::PlanService::service_full_name(), impl->plan_service.get()},
      {kc::v1::QuotaService::service_full_name(), impl->quota_service.get()},
      {kc::v1::AuditService::service_full_name(), impl->audit_service.get()},
      {kc::v1::TopologyService::service_full_name(), impl->topology_service.get()},
      {kc::v1::PoolService::service_full_name(), impl->pool_service.get()},
  };
  std::vector<std::string> served = {kc::v1::Health::service_full_name()};
  for (const auto& [name, service] : services) served.emplace_back(name);
  impl->health = std::make_unique<HealthService>(impl->guard.get(), served);
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (o.insecure_loopback) {
    creds = grpc::InsecureServerCredentials();
  } else {
    KC_ASSIGN_OR_RETURN(std::string cert, ReadWholeFile((dir / "tls/server.pem").string()));
    KC_ASSIGN_OR_RETURN(std::string key, ReadWholeFile((dir / "tls/server.key").string()));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder b;
  b.AddListeningPort(o.listen, creds, &impl->port);
  for (const auto& [name, service] : services) b.RegisterService(service);
  b.RegisterService(impl->health.get());
  // Bounds on what callers can make kcd hold: request size, calls per connection, idle
  // connections, threads.
  b.SetMaxReceiveMessageSize(o.max_request_bytes);
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, o.max_streams_per_connection);
  b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                       static_cast<int>(std::min(o.max_connection_idle_s * 1000, 2e9)));
  grpc::ResourceQuota quota("kcd");
  quota.SetMaxThreads(o.max_threads);
  b.SetResourceQuota(quota);
  impl->server = b.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return UnavailableError(fmt::format("kcd: cannot listen on {}", o.listen));
  }
  if (!o.metrics_listen.empty()) {
    Impl* raw = impl.get();
    KC_ASSIGN_OR_RETURN(impl->metrics,
                        MetricsServer::Start(o.metrics_listen, [raw] { return raw->Metrics(); }));
  }
  return std::unique_ptr<Kcd>(new Kcd(std::move(impl)));
}

int Kcd::port() const { return impl_->port; }

int Kcd::metrics_port() const { return impl_->metrics ? impl_->metrics->port() : 0; }

std::string Kcd::metrics_url() const { return impl_->metrics ? impl_->metrics->url() : ""; }

void Kcd::Shutdown() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  // In-flight calls get a moment to finish; then they are cancelled, and idle client
  // connections do not hold the daemon up.
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  impl_->metrics.reset();  // it reads the dispatcher
  impl_->dispatcher.reset();
  AuditNow(impl_->audit.get(), "kcd", "kcd.stop", "kcd", "ok", "shut down").IgnoreError();
}

}  // namespace kc::api
