// The permission checks the admin services share: resources that belong to a user (its quota,
// its audit records) or to a team (its quota), and the audited denial.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "api/audit_log.h"
#include "api/permissions.h"
#include "api/roles_file.h"
#include "base/status.h"

namespace kc::api::internal {

// The check for `action` on `resource` (kind, id and owner set) in any of `teams`: allowed when
// the table allows it without a team or in one of them (the first allowing answer, else the
// answer without a team).
CheckResult CheckInTeams(const Principal& caller, Action action, Resource resource,
                         std::span<const std::string> teams);

// The check for `action` on `resource` (kind and id set) that belongs to `user`: allowed when
// the table allows it for the user's resource in any of the user's teams, so a resource admin
// of one of them may act on it. The roles file gives the user's teams.
CheckResult CheckUserResource(const RolesConfig& roles, const Principal& caller, Action action,
                              Resource resource, std::string_view user);

// The check for `action` on `resource` (kind and id set) that belongs to team `team`: its
// members count as its owners (a submitter may act on its team's quota), and resource admins
// of the team as its admins. Not for decisions (approvals): there membership counts for
// nothing (PermissionRule::decision).
CheckResult CheckTeamResource(const Principal& caller, Action action, Resource resource,
                              std::string_view team);

// Records `caller`'s decision `action` on `resource` with `reason`, as outcome "ok", or
// "override" when `check` allowed it only as a system admin's decision on its own request.
// Returns the audit write's status.
Status AuditDecision(AuditLog* audit, const Principal& caller, std::string_view action,
                     std::string_view resource, const CheckResult& check, std::string_view reason);

// OK when `result` allows; otherwise records the denial of `action` on `resource` ("quota/
// team/vision") by `caller` in `audit` (if not null) and returns kPermissionDenied with the
// reason.
Status Authorized(AuditLog* audit, const Principal& caller, Action action,
                  std::string_view resource, const CheckResult& result);

// Records that `caller`'s `action` on `resource` failed with `why` (a change refused for its
// content or state, not a permission) in `audit` (if not null); returns `why`.
Status AuditedFailure(AuditLog* audit, const Principal& caller, std::string_view action,
                      std::string_view resource, Status why);

}  // namespace kc::api::internal
