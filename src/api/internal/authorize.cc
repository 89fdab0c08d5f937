#include "api/internal/authorize.h"

#include <algorithm>
#include <string>

#include "api/rpc_guard.h"

namespace kc::api::internal {

CheckResult CheckUserResource(const RolesConfig& roles, const Principal& caller, Action action,
                              Resource resource, std::string_view user) {
  resource.owner = std::string(user);
  resource.team.clear();
  const std::optional<Principal> owner = roles.PrincipalFor(user);
  CheckResult result = Check(caller, action, resource);
  if (result.allowed || !owner) return result;
  for (const std::string& team : owner->teams) {
    resource.team = team;
    CheckResult in_team = Check(caller, action, resource);
    if (in_team.allowed) return in_team;
  }
  return result;
}

CheckResult CheckTeamResource(const Principal& caller, Action action, Resource resource,
                              std::string_view team) {
  resource.team = std::string(team);
  const bool member =
      std::find(caller.teams.begin(), caller.teams.end(), team) != caller.teams.end();
  resource.owner = member ? caller.user : "";
  return Check(caller, action, resource);
}

Status Authorized(AuditLog* audit, const Principal& caller, Action action,
                  std::string_view resource, const CheckResult& result) {
  if (result.allowed) return OkStatus();
  AuditNow(audit, caller.user, ActionName(action), resource, "denied", result.reason)
      .IgnoreError();  // logged by AuditNow; the denial stands
  return PermissionDeniedError(result.reason);
}

Status AuditedFailure(AuditLog* audit, const Principal& caller, std::string_view action,
                      std::string_view resource, Status why) {
  AuditNow(audit, caller.user, action, resource, "failed", why.message())
      .IgnoreError();  // logged by AuditNow; the failure is returned either way
  return why;
}

}  // namespace kc::api::internal
