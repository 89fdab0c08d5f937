// The job service (proto/kc/v1/jobs.proto): submit, get, list and cancel, each checked against
// the permission table for its caller, quotas checked at submission, changes and denials
// audited. kcd serves it over its job store.
#pragma once

#include <grpcpp/grpcpp.h>

#include "api/audit_log.h"
#include "api/dispatcher.h"
#include "api/job_store.h"
#include "api/quotas.h"
#include "api/roles_file.h"
#include "api/rpc_guard.h"
#include "base/mutex.h"
#include "kc/v1/jobs.grpc.pb.h"

namespace kc::api {

struct JobServiceOptions {
  // Jobs one user may have that have not ended (pending, waiting for approval, queued,
  // running, paused); a submission past it is RESOURCE_EXHAUSTED.
  int64_t max_active_jobs_per_user = 100;
};

// Safe for concurrent use.
class JobServiceImpl final : public kc::v1::JobService::Service {
 public:
  // Not owned; all outlive the service. `roles` names the teams a job may be submitted for.
  // `audit` may be null; so may `dispatcher` (then jobs only wait in the store).
  JobServiceImpl(RpcGuard* guard, const RolesConfig* roles, JobStore* jobs, QuotaStore* quotas,
                 AuditLog* audit, Dispatcher* dispatcher = nullptr, JobServiceOptions options = {})
      : guard_(guard),
        roles_(roles),
        jobs_(jobs),
        quotas_(quotas),
        audit_(audit),
        dispatcher_(dispatcher),
        options_(options) {}

  grpc::Status Submit(grpc::ServerContext* context, const kc::v1::SubmitJobRequest* request,
                      kc::v1::JobInfo* response) override;
  grpc::Status Get(grpc::ServerContext* context, const kc::v1::GetJobRequest* request,
                   kc::v1::JobInfo* response) override;
  grpc::Status List(grpc::ServerContext* context, const kc::v1::ListJobsRequest* request,
                    kc::v1::ListJobsResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context, const kc::v1::CancelJobRequest* request,
                      kc::v1::JobInfo* response) override;
  grpc::Status Modify(grpc::ServerContext* context, const kc::v1::ModifyJobRequest* request,
                      kc::v1::JobInfo* response) override;
  grpc::Status Pause(grpc::ServerContext* context, const kc::v1::PauseJobRequest* request,
                     kc::v1::JobInfo* response) override;
  grpc::Status Resume(grpc::ServerContext* context, const kc::v1::ResumeJobRequest* request,
                      kc::v1::JobInfo* response) override;
  grpc::Status Logs(grpc::ServerContext* context, const kc::v1::JobLogsRequest* request,
                    kc::v1::JobLogsResponse* response) override;
  grpc::Status Records(grpc::ServerContext* context, const kc::v1::JobRecordsRequest* request,
                       kc::v1::JobRecordsResponse* response) override;
  grpc::Status Inspect(grpc::ServerContext* context, const kc::v1::InspectJobRequest* request,
                       kc::v1::InspectJobResponse* response) override;

 private:
  // The permission check for `action` on job `j`; a denial is audited and returned.
  Status Allowed(const Principal& caller, Action action, const JobRecord& j);

  // Checks `ask` against `owner`'s and `team`'s quotas and the jobs they have; the denial is
  // audited as `action` on `resource`. REQUIRES: quota_mu_ held until what was checked is
  // stored, so that two requests cannot both fit the room only one of them has.
  Status CheckQuotas(const Principal& caller, std::string_view action, std::string_view resource,
                     const std::string& owner, const std::string& team, const QuotaAsk& ask)
      KC_REQUIRES(quota_mu_);

  // Not owned (constructor's contract).
  RpcGuard* guard_;
  const RolesConfig* roles_;
  JobStore* jobs_;
  QuotaStore* quotas_;
  AuditLog* audit_;
  Dispatcher* dispatcher_;
  const JobServiceOptions options_;
  // Held from a quota check to the write it allows (Submit, Modify).
  Mutex quota_mu_;
};

}  // namespace kc::api
