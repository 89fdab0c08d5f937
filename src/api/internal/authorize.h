// The permission checks the admin services share: resources that belong to a user (its quota,
// its audit records) or to a team (its quota), and the audited denial.
#pragma once

#include <string_view>

#include "api/audit_log.h"
#include "api/permissions.h"
#include "api/roles_file.h"
#include "base/status.h"

namespace kc::api::internal {

// The check for `action` on `resource` (kind and id set) that belongs to `user`: allowed when
// the table allows it for the user's resource in any of the user's teams, so a resource admin
// of one of them may act on it. The roles file gives the user's teams.
CheckResult CheckUserResource(const RolesConfig& roles, const Principal& caller, Action action,
                              Resource resource, std::string_view user);

// The check for `action` on `resource` (kind and id set) that belongs to team `team`: its
// members count as its owners (a submitter may act on its team's quota), and resource admins
// of the team as its admins.
CheckResult CheckTeamResource(const Principal& caller, Action action, Resource resource,
                              std::string_view team);

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
