#include "api/permission_service.h"

#include <fmt/format.h>

#include <chrono>

namespace kc::api {

grpc::Status PermissionServiceImpl::Check(grpc::ServerContext* context,
                                          const kc::v1::PermissionCheckRequest* request,
                                          kc::v1::PermissionCheckResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status served = guard_->Serve(
      context, "kc.v1.PermissionService.Check", [&](const Principal& caller) -> Status {
        std::optional<Action> action = ActionFromName(request->action());
        if (!action) {
          return InvalidArgumentError(fmt::format(
              "action: unknown \"{}\" (see docs/operations/roles.md)", request->action()));
        }
        const kc::v1::ResourceRef& r = request->resource();
        const CheckResult result =
            api::Check(caller, *action,
                       {.kind = r.kind(), .id = r.id(), .owner = r.owner(), .team = r.team()});
        if (!result.allowed) {
          // A denial is audited; the answer stands even if the write fails (it is logged).
          AuditNow(audit_, caller.user, request->action(), fmt::format("{}/{}", r.kind(), r.id()),
                   "denied", result.reason)
              .IgnoreError();
        }
        response->set_allowed(result.allowed);
        response->set_reason(result.reason);
        response->set_principal(caller.user);
        response->set_role(std::string(RoleName(caller.role)));
        return OkStatus();
      });
  latency_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return served;
}

}  // namespace kc::api
