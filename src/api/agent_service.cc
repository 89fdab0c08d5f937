#include "api/agent_service.h"

#include <fmt/format.h>

namespace kc::api {

Status AgentServiceImpl::Allowed(const Principal& caller, const std::string& host) {
  // The RPC layer lets only agents' identities in; each speaks for its own host alone.
  if (!caller.agent_host.empty() && caller.agent_host == host) return OkStatus();
  const std::string why =
      fmt::format("{} may not report for host {}: only that host's agent may", caller.user, host);
  AuditNow(audit_, caller.user, "agent.register", "host/" + host, "denied", why)
      .IgnoreError();  // logged by AuditNow; the denial stands
  return PermissionDeniedError(why);
}

grpc::Status AgentServiceImpl::Register(grpc::ServerContext* context,
                                        const kc::v1::RegisterAgentRequest* req,
                                        kc::v1::RegisterAgentResponse* response) {
  return guard_->Serve(context, "kc.v1.AgentService.Register",
                       [&](const Principal& caller) -> Status {
                         KC_RETURN_IF_ERROR(Allowed(caller, req->host()));
                         KC_ASSIGN_OR_RETURN(*response, dispatcher_->Register(*req));
                         return OkStatus();
                       });
}

grpc::Status AgentServiceImpl::Heartbeat(grpc::ServerContext* context,
                                         const kc::v1::AgentHeartbeatRequest* req,
                                         kc::v1::AgentHeartbeatResponse* response) {
  return guard_->Serve(context, "kc.v1.AgentService.Heartbeat",
                       [&](const Principal& caller) -> Status {
                         KC_RETURN_IF_ERROR(Allowed(caller, req->host()));
                         KC_ASSIGN_OR_RETURN(*response, dispatcher_->Heartbeat(*req));
                         return OkStatus();
                       });
}

}  // namespace kc::api
