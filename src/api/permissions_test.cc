#include "api/permissions.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/support/repo_root.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

// The roles x actions matrix, generated from the table: for every action and role, a request
// on the principal's own resource, on a resource of a team it administers, and on someone
// else's, each allowed exactly when the table's scope says so.
TEST(PermissionsTest, EveryRoleAndActionFollowsTheTable) {
  int checks = 0;
  for (const PermissionRule& rule : PermissionTable()) {
    for (int ri = 0; ri < kNumRoles; ++ri) {
      const Role role = static_cast<Role>(ri);
      const Principal p{.user = "ann", .role = role, .teams = {"vision"}, .admin_of = {"vision"}};
      const Resource own{.kind = "job", .id = "1", .owner = "ann", .team = "vision"};
      const Resource team{.kind = "job", .id = "2", .owner = "bob", .team = "vision"};
      const Resource other{.kind = "job", .id = "3", .owner = "cat", .team = "nlp"};
      const Scope s = rule.scope[ri];
      const std::string where = fmt::format("{} {}", RoleName(role), ActionName(rule.action));
      // A decision is never on one's own request, but for a system admin's override.
      EXPECT_EQ(Check(p, rule.action, own).allowed,
                rule.decision ? s == Scope::kAny : s != Scope::kNone)
          << where;
      EXPECT_EQ(Check(p, rule.action, own).override_own, rule.decision && s == Scope::kAny)
          << where;
      EXPECT_EQ(Check(p, rule.action, team).allowed, s == Scope::kTeam || s == Scope::kAny)
          << where;
      EXPECT_EQ(Check(p, rule.action, other).allowed, s == Scope::kAny) << where;
      checks += 3;
    }
  }
  EXPECT_EQ(checks, 24 * 4 * 3);
}

TEST(PermissionsTest, DenialsSayWhy) {
  const Principal sub{.user = "bob", .role = Role::kSubmitter, .teams = {"nlp"}, .admin_of = {}};
  CheckResult r =
      Check(sub, Action::kJobCancel, {.kind = "job", .id = "7", .owner = "ann", .team = "nlp"});
  EXPECT_FALSE(r.allowed);
  EXPECT_THAT(r.reason, HasSubstr("bob job.cancel job 7: denied"));
  EXPECT_THAT(r.reason, HasSubstr("only its own; this belongs to ann"));
  const Principal obs{.user = "olga", .role = Role::kObserver, .teams = {}, .admin_of = {}};
  EXPECT_TRUE(Check(obs, Action::kJobGet, {.kind = "job", .id = "7", .owner = "ann"}).allowed);
  EXPECT_FALSE(Check(obs, Action::kJobSubmit, {.kind = "job", .owner = "olga"}).allowed);
  EXPECT_FALSE(Check(obs, Action::kTopologyWrite, {.kind = "topology"}).allowed);
  const Principal ra{
      .user = "ray", .role = Role::kResourceAdmin, .teams = {"vision"}, .admin_of = {"vision"}};
  EXPECT_TRUE(
      Check(ra, Action::kPlanApprove, {.kind = "plan", .id = "9", .owner = "ann", .team = "vision"})
          .allowed);
  r = Check(ra, Action::kPlanApprove, {.kind = "plan", .id = "9", .owner = "cat", .team = "nlp"});
  EXPECT_FALSE(r.allowed);
  EXPECT_THAT(r.reason, HasSubstr("teams it administers (vision)"));
  EXPECT_FALSE(Check(ra, Action::kTopologyWrite, {.kind = "topology"}).allowed);
}

// A resource admin of vision who is only a member of nlp decides nothing of nlp's, and no one
// but a system admin decides their own request or plan.
TEST(PermissionsTest, ApprovalsNeedTheTeamsAdminAndNeverTheRequester) {
  const Principal vera{.user = "vera",
                       .role = Role::kResourceAdmin,
                       .teams = {"vision", "nlp"},
                       .admin_of = {"vision"}};
  for (Action a :
       {Action::kQuotaApprove, Action::kQuotaDeny, Action::kPlanApprove, Action::kPlanDeny}) {
    SCOPED_TRACE(ActionName(a));
    EXPECT_TRUE(Check(vera, a, {.kind = "x", .id = "1", .owner = "ann", .team = "vision"}).allowed);
    CheckResult r = Check(vera, a, {.kind = "x", .id = "2", .owner = "bob", .team = "nlp"});
    EXPECT_FALSE(r.allowed);
    EXPECT_THAT(r.reason, HasSubstr("teams it administers (vision)"));
    r = Check(vera, a, {.kind = "x", .id = "3", .owner = "vera", .team = "vision"});
    EXPECT_FALSE(r.allowed);
    EXPECT_THAT(r.reason, HasSubstr("never on its own request"));
    EXPECT_FALSE(r.override_own);
    const Principal root{.user = "root", .role = Role::kSystemAdmin};
    r = Check(root, a, {.kind = "x", .id = "4", .owner = "root", .team = "vision"});
    EXPECT_TRUE(r.allowed);
    EXPECT_TRUE(r.override_own);
    EXPECT_FALSE(Check(root, a, {.kind = "x", .id = "5", .owner = "ann"}).override_own);
  }
  // Asking is not deciding: a member may still read and ask for its team's quota.
  EXPECT_TRUE(Check(vera, Action::kQuotaRequest, {.kind = "quota", .owner = "vera", .team = "nlp"})
                  .allowed);
}

TEST(PermissionsTest, NamesRoundTrip) {
  for (const PermissionRule& rule : PermissionTable()) {
    EXPECT_EQ(ActionFromName(ActionName(rule.action)), rule.action);
  }
  for (int r = 0; r < kNumRoles; ++r) {
    EXPECT_EQ(RoleFromName(RoleName(static_cast<Role>(r))), static_cast<Role>(r));
  }
  EXPECT_FALSE(ActionFromName("job.delete_everything").has_value());
  EXPECT_FALSE(RoleFromName("root").has_value());
}

// The docs show the table the code enforces.
TEST(PermissionsTest, TheDocsShowTheTable) {
  std::ifstream in(testing::RepoRoot() + "docs/operations/roles.md");
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_THAT(doc.str(), HasSubstr(PermissionTableMarkdown()))
      << "regenerate the table in docs/operations/roles.md from PermissionTableMarkdown():\n"
      << PermissionTableMarkdown();
}

}  // namespace
}  // namespace kc::api
