// A cluster's control-plane directory and the kcd server over it. `kc init` lays the
// directory out (roles file, TLS material, the first admin's token, state and audit
// databases); kcd serves the API from it over TLS. Docs: docs/operations/cluster.md.
//
//   DIR/roles.yaml        who is who (api/roles_file.h); edited only by a system admin
//   DIR/tls/ca.pem        the cluster's CA certificate: clients trust it
//   DIR/tls/ca.key        the CA's key (0600), to issue more certificates
//   DIR/tls/server.pem    kcd's certificate; server.key its key (0600)
//   DIR/admin.token       the first admin's bearer token (0600)
//   DIR/kcd.db            kcd's state: tokens, jobs, quotas (SQLite, WAL; 0600)
//   DIR/audit.db          the audit log, chained with a key (0600)
//   DIR/audit.key         the chain's key (0600): only kcd (and admins on its host) read it
//   DIR/audit.head        the newest record's seq and MAC, MAC'ed with the key (0600)
//   DIR/topology.yaml     the cluster's inventory, when given (TopologyService replaces it)
//   DIR/pools.yaml        the pools over it, when set (PoolService replaces it)
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace kc::api {

struct InitOptions {
  std::string dir;
  std::string cluster = "local";
  std::string admin = "admin";
  std::string inventory_path;  // copied to DIR/topology.yaml when set
  std::vector<std::string> hosts = {"localhost", "127.0.0.1"};  // kcd's certificate names
  double token_ttl_s = 90 * 86400.0;
  int tls_days = 825;
};

struct InitResult {
  std::string admin_token;
};

// Creates the directory. kAlreadyExists if DIR/roles.yaml exists (nothing is changed);
// kNotFound for a missing inventory; kUnavailable naming the file for a write that fails.
Result<InitResult> InitCluster(const InitOptions& options);

struct KcdOptions {
  std::string dir;
  std::string listen = "127.0.0.1:7470";  // port 0: any free port
  // Plaintext instead of TLS: refused unless the listen address is loopback.
  bool insecure_loopback = false;
  // Agents: how often they report, when a silent one is declared lost (its jobs go back to
  // the queue), how often each running job's execution-time permission checks are made.
  double heartbeat_period_s = 0.2;
  double agent_lost_after_s = 10;
  double check_period_s = 1;
  // What one caller can make kcd hold (docs/operations/security.md, "Limits"):
  int64_t max_jobs_per_user = 100;                    // jobs not ended, per user
  int64_t max_log_bytes_per_job = int64_t{16} << 20;  // output kept per job (the newest)
  int max_request_bytes = 4 << 20;                    // one request's size
  int max_calls_in_flight_per_caller = 64;            // one caller's calls in progress
  int max_streams_per_connection = 100;               // calls at once on one connection
  double max_connection_idle_s = 600;                 // an idle connection is closed after this
  int max_threads = 64;                               // threads serving calls, all callers together
  // Prometheus metrics over HTTP (GET /metrics) on HOST:PORT, plaintext and unauthenticated as
  // scrapers expect: keep it on an address only the monitoring can reach. "" = none.
  std::string metrics_listen;
  // Appended to the metrics page when set (kc up: its agent's page). Called on the metrics
  // server's thread for each scrape.
  std::function<std::string()> more_metrics;
};

// The control-plane server: Health, the permission, job, agent, quota, audit, topology and
// pool services, and the dispatcher that runs the L4 scheduler over the agents' devices. Safe
// for concurrent use; gRPC serves calls on its own threads.
class Kcd {
 public:
  // Reads the roles file, opens the databases, records the start in the audit log (with the
  // roles file's hash, and "roles changed" when it differs from the previous start's), and
  // starts serving. kInvalidArgument for a bad roles file or a plaintext non-loopback listen
  // address; kNotFound for a directory `kc init` did not make; kUnavailable when the address
  // cannot be bound.
  static Result<std::unique_ptr<Kcd>> Start(const KcdOptions& options);
  ~Kcd();

  int port() const;
  int metrics_port() const;         // 0 without --metrics-listen
  std::string metrics_url() const;  // "" without --metrics-listen
  // Stops serving (in-flight calls get half a second to finish, then are cancelled) and
  // records the stop. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit Kcd(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
