// The permission service (proto/kc/v1/permission.proto): Check answers from the permission
// table for the authenticated caller, every time, uncached. kcd serves it; workers call it
// before touching data paths, checkpoints and devices.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "api/metrics.h"
#include "api/rpc_guard.h"
#include "base/status.h"
#include "kc/v1/permission.grpc.pb.h"

namespace kc::api {

// Safe for concurrent use.
class PermissionServiceImpl final : public kc::v1::PermissionService::Service {
 public:
  // `guard` and `audit` (which may be null) are not owned and outlive the service. Denials
  // are written to `audit`.
  PermissionServiceImpl(RpcGuard* guard, AuditLog* audit) : guard_(guard), audit_(audit) {}

  grpc::Status Check(grpc::ServerContext* context, const kc::v1::PermissionCheckRequest* request,
                     kc::v1::PermissionCheckResponse* response) override;

  // How long Check takes to serve, token verification and limits included (kcd's metrics).
  const LatencyHistogram& latency() const { return latency_; }

 private:
  LatencyHistogram latency_;
  RpcGuard* guard_;  // not owned (constructor's contract)
  AuditLog* audit_;  // not owned, may be null (constructor's contract)
};

}  // namespace kc::api
