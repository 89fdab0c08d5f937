#include "api/permissions.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace kc::api {
namespace {

constexpr Scope N = Scope::kNone, O = Scope::kOwn, T = Scope::kTeam, A = Scope::kAny;
constexpr bool kDecision = true;

// The one table. Columns: system admin, resource admin, submitter, observer.
constexpr PermissionRule kTable[] = {
    {Action::kJobSubmit, {A, O, O, N}, "submit a job (it belongs to the submitter)"},
    {Action::kJobList, {A, T, O, A}, "list jobs"},
    {Action::kJobGet, {A, T, O, A}, "read a job's state"},
    {Action::kJobLogs, {A, T, O, A}, "read a job's logs"},
    {Action::kJobModify, {A, T, O, N}, "change a pending job's request"},
    {Action::kJobCancel, {A, T, O, N}, "cancel a job"},
    {Action::kJobPause, {A, T, O, N}, "checkpoint and pause a job"},
    {Action::kJobResume, {A, T, O, N}, "resume a paused job"},
    {Action::kPlanGet, {A, T, O, A}, "read a job's plan"},
    {Action::kPlanApprove,
     {A, T, N, N},
     "approve a plan marked approval required (never one's own job's)",
     kDecision},
    {Action::kPlanDeny, {A, T, N, N}, "deny such a plan (never one's own job's)", kDecision},
    {Action::kQuotaGet, {A, T, O, A}, "read a quota"},
    {Action::kQuotaRequest, {A, T, O, N}, "ask for a quota increase"},
    {Action::kQuotaApprove,
     {A, T, N, N},
     "approve a quota request (never one's own request or quota)",
     kDecision},
    {Action::kQuotaDeny,
     {A, T, N, N},
     "deny a quota request (never one's own request or quota)",
     kDecision},
    {Action::kPoolList, {A, A, A, A}, "list pools"},
    {Action::kPoolModify, {A, T, N, N}, "change a pool's settings"},
    {Action::kTopologyRead, {A, A, A, A}, "read the topology"},
    {Action::kTopologyWrite, {A, N, N, N}, "change the topology (measured values, groups)"},
    {Action::kAuditQuery, {A, T, O, A}, "read audit records"},
    {Action::kAuditVerify, {A, A, N, A}, "verify the audit chain"},
    {Action::kDataRead, {A, T, O, N}, "a job's workers read a data path"},
    {Action::kCheckpointWrite, {A, T, O, N}, "a job's workers write its checkpoint directory"},
    {Action::kDeviceUse, {A, T, O, N}, "a job's workers use the devices given to it"},
};

constexpr std::array<std::string_view, 24> kActionNames = {
    "job.submit",   "job.list",    "job.get",          "job.logs",       "job.modify",
    "job.cancel",   "job.pause",   "job.resume",       "plan.get",       "plan.approve",
    "plan.deny",    "quota.get",   "quota.request",    "quota.approve",  "quota.deny",
    "pool.list",    "pool.modify", "topology.read",    "topology.write", "audit.query",
    "audit.verify", "data.read",   "checkpoint.write", "device.use"};

constexpr bool TableInActionOrder() {
  for (size_t i = 0; i < std::size(kTable); ++i) {
    if (static_cast<size_t>(kTable[i].action) != i) return false;
  }
  return std::size(kTable) == kActionNames.size();
}
static_assert(TableInActionOrder(), "kTable must list every Action once, in Action order");

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return !x.empty() && std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::string_view RoleName(Role r) {
  switch (r) {
    case Role::kSystemAdmin:
      return "system_admin";
    case Role::kResourceAdmin:
      return "resource_admin";
    case Role::kSubmitter:
      return "submitter";
    case Role::kObserver:
      return "observer";
  }
  return "?";
}

std::optional<Role> RoleFromName(std::string_view name) {
  for (int r = 0; r < kNumRoles; ++r) {
    if (RoleName(static_cast<Role>(r)) == name) return static_cast<Role>(r);
  }
  return std::nullopt;
}

std::string_view ActionName(Action a) { return kActionNames[static_cast<size_t>(a)]; }

std::optional<Action> ActionFromName(std::string_view name) {
  for (size_t i = 0; i < kActionNames.size(); ++i) {
    if (kActionNames[i] == name) return static_cast<Action>(i);
  }
  return std::nullopt;
}

std::string_view ScopeName(Scope s) {
  switch (s) {
    case Scope::kNone:
      return "-";
    case Scope::kOwn:
      return "own";
    case Scope::kTeam:
      return "team";
    case Scope::kAny:
      return "any";
  }
  return "?";
}

std::span<const PermissionRule> PermissionTable() { return kTable; }

CheckResult Check(const Principal& p, Action action, const Resource& r) {
  const PermissionRule& rule = kTable[static_cast<size_t>(action)];
  const Scope scope = rule.scope[static_cast<int>(p.role)];
  const std::string what =
      fmt::format("{} {} {}{}", p.user, ActionName(action), r.kind, r.id.empty() ? "" : " " + r.id);
  auto verdict = [&](bool ok, std::string_view why) {
    return CheckResult{ok, fmt::format("{}: {} ({} may {} {})", what, ok ? "allowed" : "denied",
                                       RoleName(p.role), ActionName(action), why)};
  };
  if (!p.agent_host.empty()) {
    return {false, fmt::format("{}: denied (an agent's identity acts only through the agent "
                               "service)",
                               what)};
  }
  const bool mine = !r.owner.empty() && r.owner == p.user;
  // A decision on one's own request is nobody's but a system admin's, who overrides.
  if (rule.decision && mine && scope != Scope::kNone) {
    if (scope != Scope::kAny) {
      return verdict(false,
                     "never on its own request or job; another admin of the team, or a system "
                     "admin, decides it");
    }
    CheckResult result = verdict(true, "anything; its own request: an override");
    result.override_own = true;
    return result;
  }
  const bool own = mine && !rule.decision;
  // A collection (no id, no owner): listing is allowed; the server filters what it returns.
  const bool collection = r.id.empty() && r.owner.empty() && r.team.empty();
  switch (scope) {
    case Scope::kNone:
      return verdict(false, "nothing");
    case Scope::kAny:
      return verdict(true, "anything");
    case Scope::kOwn:
      if (own || collection) return verdict(true, "its own");
      return verdict(false, fmt::format("only its own; this belongs to {}",
                                        r.owner.empty() ? "nobody" : r.owner));
    case Scope::kTeam:
      if (own || collection || Contains(p.admin_of, r.team)) {
        return verdict(true, "its own and its teams'");
      }
      return verdict(
          false,
          fmt::format("only its own and those of teams it administers ({}); "
                      "this belongs to {}{}",
                      p.admin_of.empty() ? "none" : fmt::format("{}", fmt::join(p.admin_of, ", ")),
                      r.owner.empty() ? "nobody" : r.owner,
                      r.team.empty() ? "" : " of team " + r.team));
  }
  return verdict(false, "nothing");
}

std::string PermissionTableMarkdown() {
  std::string out = "| action | what | system_admin | resource_admin | submitter | observer |\n";
  out += "| --- | --- | --- | --- | --- | --- |\n";
  for (const PermissionRule& rule : kTable) {
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n", ActionName(rule.action), rule.what,
                       ScopeName(rule.scope[0]), ScopeName(rule.scope[1]), ScopeName(rule.scope[2]),
                       ScopeName(rule.scope[3]));
  }
  return out;
}

}  // namespace kc::api
