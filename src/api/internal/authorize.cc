#include "api/internal/authorize.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "api/rpc_guard.h"

namespace kc::api::internal {

CheckResult CheckInTeams(const Principal& caller, Action action, Resource resource,
                         std::span<const std::string> teams) {
  resource.team.clear();
  CheckResult result = Check(caller, action, resource);
  if (result.allowed) return result;
  for (const std::string& team : teams) {
    resource.team = team;
    CheckResult in_team = Check(caller, action, resource);
    if (in_team.allowed) return in_team;
  }
  return result;
}

CheckResult CheckUserResource(const RolesConfig& roles, const Principal& caller, Action action,
                              Resource resource, std::string_view user) {
  resource.owner = std::string(user);
  const std::optional<Principal> owner = roles.PrincipalFor(user);
  return CheckInTeams(
      caller, action, std::move(resource),
      owner ? std::span<const std::string>(owner->teams) : std::span<const std::string>());
}

CheckResult CheckTeamResource(const Principal& caller, Action action, Resource resource,
                              std::string_view team) {
  resource.team = std::string(team);
  const bool member =
      std::find(caller.teams.begin(), caller.teams.end(), team) != caller.teams.end();
  resource.owner = member ? caller.user : "";
  return Check(caller, action, resource);
}

Status AuditDecision(AuditLog* audit, const Principal& caller, std::string_view action,
                     std::string_view resource, const CheckResult& check, std::string_view reason) {
  return AuditNow(audit, caller.user, action, resource, check.override_own ? "override" : "ok",
                  check.override_own
                      ? fmt::format("{} (a system admin deciding its own request)", reason)
                      : std::string(reason));
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
