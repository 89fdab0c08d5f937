// The agent service (proto/kc/v1/agent.proto): agents register their hosts' devices and
// report on their jobs; the dispatcher answers with orders. Callers are agents' machine
// identities (agent tokens, `kc token issue --agent HOST`), each for its own host; no user,
// a system admin included, calls it.
#pragma once

#include <grpcpp/grpcpp.h>

#include "api/audit_log.h"
#include "api/dispatcher.h"
#include "api/rpc_guard.h"
#include "kc/v1/agent.grpc.pb.h"

namespace kc::api {

// Safe for concurrent use.
class AgentServiceImpl final : public kc::v1::AgentService::Service {
 public:
  // Not owned; all outlive the service. `audit` may be null.
  AgentServiceImpl(RpcGuard* guard, Dispatcher* dispatcher, AuditLog* audit)
      : guard_(guard), dispatcher_(dispatcher), audit_(audit) {}

  grpc::Status Register(grpc::ServerContext* context, const kc::v1::RegisterAgentRequest* request,
                        kc::v1::RegisterAgentResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const kc::v1::AgentHeartbeatRequest* request,
                         kc::v1::AgentHeartbeatResponse* response) override;

 private:
  Status Allowed(const Principal& caller, const std::string& host);

  // Not owned (constructor's contract).
  RpcGuard* guard_;
  Dispatcher* dispatcher_;
  AuditLog* audit_;
};

}  // namespace kc::api
