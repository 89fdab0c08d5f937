// The agent: one per host. It registers the host's devices with kcd, then reports every
// heartbeat period on the jobs it runs and carries out kcd's orders: it starts a job's ranks
// as a `kc train` process group in the job's directory and stops it (SIGTERM, then SIGKILL
// after a grace period). Before a job starts and every check period while it runs, the agent
// asks the permission service, with the job owner's token, whether the job may still use its
// devices, write its checkpoints and read its data (the third of the three checks); a denial
// stops the job, which saves a checkpoint as it stops. Job-supplied paths stay under the agent's
// roots. Docs: docs/operations/agents.md.
#pragma once

#include <memory>
#include <string>

#include "api/client.h"
#include "base/status.h"

namespace kc::api {

struct AgentOptions {
  ClientConfig kcd;      // where kcd is, with a token that may write the topology
  std::string host;      // this host's name in the cluster's topology
  int devices = 0;       // devices found on this host
  std::string work_dir;  // jobs' directories (WORK/jobs/ID) and checkpoints
  // What a job's `data` path is relative to ("" = WORK/data); a job naming none reads
  // DATA_ROOT/fortunes/manifest.json, as `kc train` reads data/fortunes/manifest.json.
  std::string data_root;
  std::string kc_binary;  // the kc executable that runs `kc train`
  // A supervisor agent: no devices; it runs the launchers of runs across hosts, whose ranks
  // the hosts' agents start (kc.v1.StartOrder.role). Its host is not one of the topology's.
  bool supervisor = false;
  // SIGTERM to SIGKILL: the time a stopped job has to save a checkpoint of its last step.
  double stop_grace_s = 30;
  // Prometheus metrics of the jobs it runs (GET /metrics, plaintext) on HOST:PORT (port 0: any
  // free one); "" = none (docs/operations/metrics.md).
  std::string metrics_listen;
};

// Safe for concurrent use; one thread of its own does the work.
class Agent {
 public:
  // Registers with kcd and starts the heartbeats. A kcd that cannot be reached yet is retried
  // in the background; an answer that will not change by retrying (unknown host, wrong device
  // count, no right to register) is returned.
  static Result<std::unique_ptr<Agent>> Start(AgentOptions options);
  // Stops every job it runs (kcd puts them back in the queue) and the heartbeats.
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  int running_jobs() const;
  int metrics_port() const;         // 0 without metrics_listen
  std::string metrics_url() const;  // "" without metrics_listen
  // Its metrics page (what metrics_listen serves), for a server that serves it with its own.
  std::string MetricsText() const;

 private:
  struct Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
