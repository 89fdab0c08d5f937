// The quota service (proto/kc/v1/quotas.proto): a user's or team's quota and usage, and
// quota-increase requests filed, listed, approved and denied, each checked against the
// permission table for its caller, requests, decisions and denials audited. kcd serves it
// over its quota and job stores.
#pragma once

#include <grpcpp/grpcpp.h>

#include "api/audit_log.h"
#include "api/job_store.h"
#include "api/quotas.h"
#include "api/roles_file.h"
#include "api/rpc_guard.h"
#include "kc/v1/quotas.grpc.pb.h"

namespace kc::api {

// Safe for concurrent use.
class QuotaServiceImpl final : public kc::v1::QuotaService::Service {
 public:
  // Not owned; all outlive the service. `audit` may be null. `roles` gives the teams of the
  // user a quota belongs to (fixed while kcd runs).
  QuotaServiceImpl(RpcGuard* guard, const RolesConfig* roles, QuotaStore* quotas, JobStore* jobs,
                   AuditLog* audit)
      : guard_(guard), roles_(roles), quotas_(quotas), jobs_(jobs), audit_(audit) {}

  grpc::Status Get(grpc::ServerContext* context, const kc::v1::GetQuotaRequest* request,
                   kc::v1::QuotaInfo* response) override;
  grpc::Status RequestIncrease(grpc::ServerContext* context,
                               const kc::v1::QuotaIncreaseRequest* request,
                               kc::v1::QuotaRequestInfo* response) override;
  grpc::Status ListRequests(grpc::ServerContext* context,
                            const kc::v1::ListQuotaRequestsRequest* request,
                            kc::v1::ListQuotaRequestsResponse* response) override;
  grpc::Status Approve(grpc::ServerContext* context, const kc::v1::DecideQuotaRequest* request,
                       kc::v1::QuotaRequestInfo* response) override;
  grpc::Status Deny(grpc::ServerContext* context, const kc::v1::DecideQuotaRequest* request,
                    kc::v1::QuotaRequestInfo* response) override;

 private:
  // The permission check for `action` on the quota of `subject` `name`.
  CheckResult CheckQuotaAccess(const Principal& caller, Action action, QuotaSubject subject,
                               const std::string& name) const;
  // The permission check for deciding `request` (`action`: quota.approve or quota.deny): by
  // an admin of the subject team (or of one of the subject user's teams) who is neither its
  // requester nor the user whose quota it is, or by a system admin (override_own when either).
  CheckResult CheckDecision(const Principal& caller, Action action,
                            const QuotaRequest& request) const;
  // Approve and Deny.
  Status Decide(const Principal& caller, const kc::v1::DecideQuotaRequest& request, bool approve,
                kc::v1::QuotaRequestInfo* response);

  // Not owned (constructor's contract).
  RpcGuard* guard_;
  const RolesConfig* roles_;
  QuotaStore* quotas_;
  JobStore* jobs_;
  AuditLog* audit_;
};

}  // namespace kc::api
