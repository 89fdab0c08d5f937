// The four fixed roles and what each may do: one table (kPermissionTable), which the
// permission service consults for every check, the docs print (PermissionTableMarkdown), and
// the tests enumerate. Roles come from the cluster's roles file, read at start; nothing at run
// time changes them. Docs: docs/operations/roles.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::api {

enum class Role : uint8_t { kSystemAdmin, kResourceAdmin, kSubmitter, kObserver };
inline constexpr int kNumRoles = 4;
std::string_view RoleName(Role r);  // "system_admin", "resource_admin", "submitter", "observer"
std::optional<Role> RoleFromName(std::string_view name);

// Every action the API and the execution-time checks name. The wire names ("job.submit")
// are what audit records and permission-check requests carry.
enum class Action : uint8_t {
  kJobSubmit,
  kJobList,
  kJobGet,
  kJobLogs,
  kJobModify,
  kJobCancel,
  kJobPause,
  kJobResume,
  kPlanGet,
  kPlanApprove,
  kPlanDeny,
  kQuotaGet,
  kQuotaRequest,
  kQuotaApprove,
  kQuotaDeny,
  kPoolList,
  kPoolModify,
  kTopologyRead,
  kTopologyWrite,
  kAuditQuery,
  kAuditVerify,
  // During execution: a job's workers ask before touching these.
  kDataRead,
  kCheckpointWrite,
  kDeviceUse,
};
std::string_view ActionName(Action a);  // "job.submit", ...
std::optional<Action> ActionFromName(std::string_view name);

// On which resources a role may take an action.
enum class Scope : uint8_t {
  kNone,  // never
  kOwn,   // the principal's own (resource.owner == principal.user)
  kTeam,  // its own, and those of the teams it administers (resource.team)
  kAny,   // every one
};
std::string_view ScopeName(Scope s);  // "-", "own", "team", "any"

struct PermissionRule {
  Action action;
  Scope scope[kNumRoles];  // indexed by Role
  std::string_view what;   // one line for the docs
  // A decision on someone's request (an approval): owning the resource (having asked, or
  // being its subject) grants nothing, so `own` and `team` reach only the teams the principal
  // administers, and never its own request; a system admin may decide its own (an override,
  // which the services audit as such).
  bool decision = false;
};

// The table, one row per action, in Action order.
std::span<const PermissionRule> PermissionTable();

struct Principal {
  std::string user;
  Role role = Role::kObserver;
  std::vector<std::string> teams;     // member of
  std::vector<std::string> admin_of;  // resource admin of these teams' pools
  // Set for an agent's machine identity ("agent/HOST" as `user`): the host it speaks for. An
  // agent has no role: the table allows it nothing, and kcd's RPC layer lets it call the agent
  // service alone, for this host alone.
  std::string agent_host;
};

struct Resource {
  std::string kind;   // "job", "plan", "quota", "pool", "topology", "audit", "path", "device"
  std::string id;     // "" for a collection (job.list) or the cluster
  std::string owner;  // the user it belongs to, "" if none
  std::string team;   // the team it belongs to, "" if none
};

struct CheckResult {
  bool allowed = false;
  std::string reason;  // why, for the caller and the audit log
  // Allowed only because the principal is a system admin deciding its own request: the
  // service records the decision with outcome "override".
  bool override_own = false;
};

// The decision for one request: the table's scope for the principal's role, applied to the
// resource. For a decision action (PermissionRule::decision) the resource's owner is whoever
// asked (the requester, the job's owner): a principal never decides its own, except a system
// admin (override_own). Pure and cheap; the permission service calls it for every check,
// uncached.
CheckResult Check(const Principal& principal, Action action, const Resource& resource);

// The table as a Markdown table (role columns, one row per action), for docs/operations/roles.md.
std::string PermissionTableMarkdown();

}  // namespace kc::api
