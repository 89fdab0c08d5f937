// The dispatcher: kcd's side of running jobs. It feeds jobs from the job store to the L4
// scheduler (after the second permission check, at scheduling time), hands the scheduler's
// decisions to the agents as orders (start these ranks on these devices, stop that run),
// and turns what agents report (started, progress, exited, stopped by an execution check)
// into the jobs' phases. The job store is the truth: a job cancelled or paused there is
// stopped here at the next pass. Runs are recorded in kcd's database, so a kcd restart adopts
// the jobs still running on their agents. Design: docs/design/dispatch.md.
#pragma once

#include <memory>
#include <string>

#include "api/audit_log.h"
#include "api/job_store.h"
#include "api/plan_store.h"
#include "api/roles_file.h"
#include "api/tokens.h"
#include "base/status.h"
#include "kc/v1/agent.pb.h"
#include "kc/v1/jobs.pb.h"

namespace kc::api {

struct DispatcherOptions {
  // The cluster directory: topology.yaml, pools.yaml, plan-approval.yaml and comm-limits.yaml
  // (each optional), kcd.db.
  std::string dir;
  // Not owned; all outlive the dispatcher. `audit` may be null.
  JobStore* jobs = nullptr;
  TokenStore* tokens = nullptr;
  AuditLog* audit = nullptr;
  const RolesConfig* roles = nullptr;
  PlanStore* plans = nullptr;       // null: jobs are not planned
  double heartbeat_period_s = 0.2;  // what agents are told
  double lost_after_s = 10;         // silence after which an agent's jobs go back to the queue
  double check_period_s = 1;        // execution-time permission checks, per running job
  double pass_period_s = 0.1;       // scheduling passes (also after every Wake)
  // The numeric address kcd serves the stores of runs across hosts on (each its own port):
  // one every host reaches. "": such runs wait.
  std::string store_address;
};

// Safe for concurrent use: the agent service calls it from gRPC's threads while its own
// thread runs the passes.
class Dispatcher {
 public:
  // Reads DIR/topology.yaml (without one, jobs wait with the reason "no topology"),
  // DIR/pools.yaml (default: one pool of every device), DIR/plan-approval.yaml (default: no
  // limits; a new job whose plan passes them waits in approval_required) and DIR/comm-limits.yaml
  // (default: none; each job's runs get their entry's rate limit and the lanes), adopts the runs
  // recorded by a previous kcd, and starts passing. kInvalidArgument naming the file for a bad
  // topology, pools or comm limits file.
  static Result<std::unique_ptr<Dispatcher>> Start(DispatcherOptions options);
  ~Dispatcher();  // stops the passes
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // The agent service's calls (proto/kc/v1/agent.proto), with its errors.
  Result<kc::v1::RegisterAgentResponse> Register(const kc::v1::RegisterAgentRequest& request);
  Result<kc::v1::AgentHeartbeatResponse> Heartbeat(const kc::v1::AgentHeartbeatRequest& request);

  // JobService.Inspect: asks the supervisor of job `job`'s run where every rank is, through
  // the agent of its launcher with its next heartbeat. kFailedPrecondition when no run of it
  // goes on, or it is a command job.
  Result<kc::v1::InspectJobResponse> Inspect(int64_t job);

  // Runs a pass soon (a job was submitted, cancelled, paused or resumed).
  void Wake();

  // Appends its metrics (Prometheus text format, api/metrics.h): the scheduler's queue depth
  // and pass time, registered agents, and per running job its size, step and checkpoint.
  void AppendMetrics(std::string* out) const;

  // The admin's comm limits as they apply to `job` (DIR/comm-limits.yaml's entry for
  // "TEAM/NAME", or its default, and its lanes), in words; "" without a limits file.
  std::string CommLimitsOf(const JobRecord& job) const;

 private:
  struct Impl;
  explicit Dispatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
