// The plan service (proto/kc/v1/plans.proto): a job's plan, and a resource admin's approval
// or denial of a plan past the cluster's limits, checked against the permission table and
// audited.
#pragma once

#include <grpcpp/grpcpp.h>

#include "api/audit_log.h"
#include "api/dispatcher.h"
#include "api/job_store.h"
#include "api/plan_store.h"
#include "api/rpc_guard.h"
#include "kc/v1/plans.grpc.pb.h"

namespace kc::api {

// Safe for concurrent use.
class PlanServiceImpl final : public kc::v1::PlanService::Service {
 public:
  // Not owned; all outlive the service. `audit` and `dispatcher` may be null.
  PlanServiceImpl(RpcGuard* guard, JobStore* jobs, PlanStore* plans, AuditLog* audit,
                  Dispatcher* dispatcher)
      : guard_(guard), jobs_(jobs), plans_(plans), audit_(audit), dispatcher_(dispatcher) {}

  grpc::Status Get(grpc::ServerContext* context, const kc::v1::GetPlanRequest* request,
                   kc::v1::PlanInfo* response) override;
  grpc::Status Approve(grpc::ServerContext* context, const kc::v1::DecidePlanRequest* request,
                       kc::v1::PlanInfo* response) override;
  grpc::Status Deny(grpc::ServerContext* context, const kc::v1::DecidePlanRequest* request,
                    kc::v1::PlanInfo* response) override;

 private:
  // Approve and Deny.
  Status Decide(const Principal& caller, const kc::v1::DecidePlanRequest& request, bool approve,
                kc::v1::PlanInfo* response);

  // Not owned (constructor's contract).
  RpcGuard* guard_;
  JobStore* jobs_;
  PlanStore* plans_;
  AuditLog* audit_;
  Dispatcher* dispatcher_;
};

}  // namespace kc::api
