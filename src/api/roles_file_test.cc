#include "api/roles_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "sched/pools.h"
#include "tests/support/repo_root.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

TEST(RolesFileTest, TheExampleGivesEachUserTheirPrincipal) {
  Result<RolesConfig> c = LoadRolesFile(testing::RepoRoot() + "examples/admin/roles.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->cluster, "dgx-a100x16");
  std::optional<Principal> vera = c->PrincipalFor("vera");
  ASSERT_TRUE(vera.has_value());
  EXPECT_EQ(vera->role, Role::kResourceAdmin);
  EXPECT_EQ(vera->admin_of, std::vector<std::string>{"vision"});
  std::optional<Principal> ann = c->PrincipalFor("ann");
  ASSERT_TRUE(ann.has_value());
  EXPECT_EQ(ann->role, Role::kSubmitter);
  EXPECT_TRUE(ann->admin_of.empty());
  EXPECT_FALSE(c->PrincipalFor("mallory").has_value());
  // Through the table: vera may cancel ann's job in vision, not bob's in nlp.
  EXPECT_TRUE(
      Check(*vera, Action::kJobCancel, {.kind = "job", .id = "1", .owner = "ann", .team = "vision"})
          .allowed);
  EXPECT_FALSE(
      Check(*vera, Action::kJobCancel, {.kind = "job", .id = "2", .owner = "bob", .team = "nlp"})
          .allowed);
}

// The example roles and pools agree: a team's `pool:` is a pool of the example pools file
// that takes that team.
TEST(RolesFileTest, TheExampleTeamsPoolsTakeTheirTeams) {
  Result<RolesConfig> c = LoadRolesFile(testing::RepoRoot() + "examples/admin/roles.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  Result<sched::PoolConfig> pools =
      sched::LoadPoolConfig(testing::RepoRoot() + "examples/admin/pools.yaml");
  ASSERT_TRUE(pools.ok()) << pools.status().message();
  int with_pool = 0;
  for (const TeamSpec& t : c->teams) {
    if (t.pool.empty()) continue;
    ++with_pool;
    const auto p = std::find_if(pools->pools.begin(), pools->pools.end(),
                                [&](const sched::PoolSpec& s) { return s.name == t.pool; });
    ASSERT_NE(p, pools->pools.end()) << "team " << t.name << ": no pool " << t.pool;
    EXPECT_TRUE(p->teams.empty() ||
                std::find(p->teams.begin(), p->teams.end(), t.name) != p->teams.end())
        << "pool " << t.pool << " does not take team " << t.name;
  }
  EXPECT_GT(with_pool, 0);
}

TEST(RolesFileTest, ErrorsNameTheFileLineAndKey) {
  auto error = [](std::string text) {
    return LoadRolesString(text, "roles.yaml").status().message();
  };
  const std::string admin = "cluster: c\nusers:\n  - {name: root, role: system_admin}\n";
  EXPECT_THAT(error(admin + "  - {name: x, role: wizard}\n"),
              HasSubstr("roles.yaml:4: users[1].role: expected one of \"system_admin\""));
  EXPECT_THAT(error(admin + "  - {name: root, role: observer}\n"),
              HasSubstr("roles.yaml:4: users[1].name: names a user listed before"));
  EXPECT_THAT(error(admin + "  - {name: a, role: submitter, teams: [ghosts]}\n"),
              HasSubstr("team \"ghosts\" is not declared under teams"));
  EXPECT_THAT(error(admin + "  - {name: s, role: submitter}\nteams:\n  - {name: t, admins: [s]}\n"),
              HasSubstr("\"s\" is a submitter; a team admin is a resource_admin"));
  EXPECT_THAT(error(admin + "teams:\n  - {name: t, admins: [nobody]}\n"),
              HasSubstr("\"nobody\" is not a user of this file"));
  EXPECT_THAT(error("cluster: c\nusers:\n  - {name: a, role: observer}\n"),
              HasSubstr("expected at least one system_admin"));
  EXPECT_THAT(error(admin + "extra: 1\n"), HasSubstr("extra"));
  EXPECT_EQ(LoadRolesFile("/nonexistent/roles.yaml").status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kc::api
