// The audit service (proto/kc/v1/audit.proto): audit records over RPC, each caller seeing
// what its audit.query scope covers, and the hash-chain verification. kcd serves it over its
// audit log.
#pragma once

#include <grpcpp/grpcpp.h>

#include "api/audit_log.h"
#include "api/roles_file.h"
#include "api/rpc_guard.h"
#include "kc/v1/audit.grpc.pb.h"

namespace kc::api {

// Safe for concurrent use.
class AuditServiceImpl final : public kc::v1::AuditService::Service {
 public:
  // Not owned; all outlive the service. `roles` gives the teams of a record's principal
  // (fixed while kcd runs).
  AuditServiceImpl(RpcGuard* guard, const RolesConfig* roles, AuditLog* audit)
      : guard_(guard), roles_(roles), audit_(audit) {}

  grpc::Status Query(grpc::ServerContext* context, const kc::v1::AuditQueryRequest* request,
                     kc::v1::AuditQueryResponse* response) override;
  grpc::Status Verify(grpc::ServerContext* context, const kc::v1::AuditVerifyRequest* request,
                      kc::v1::AuditVerifyResponse* response) override;

 private:
  // Not owned (constructor's contract).
  RpcGuard* guard_;
  const RolesConfig* roles_;
  AuditLog* audit_;
};

}  // namespace kc::api
