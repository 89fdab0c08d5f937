// The roles file: who is who on a cluster. Written by `kc init`, edited only by a system
// admin, read by kcd at start (a running kcd offers no way to change it). Format and errors:
// docs/operations/roles.md ("The roles file").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/permissions.h"
#include "base/status.h"

namespace kc::api {

struct TeamSpec {
  std::string name;
  std::vector<std::string> admins;  // users who are resource admins of the team's pool
  std::string pool;                 // the team's pool ("" if it has none)
};

struct UserSpec {
  std::string name;
  Role role = Role::kObserver;
  std::vector<std::string> teams;
};

struct RolesConfig {
  std::string cluster;
  std::vector<UserSpec> users;
  std::vector<TeamSpec> teams;

  // The principal of `user`: its role, teams, and the teams it administers. nullopt for a
  // user the file does not name.
  std::optional<Principal> PrincipalFor(std::string_view user) const;
};

// Reads a roles file. kNotFound if it does not exist; kInvalidArgument as
// "FILE:LINE: key.path: what" for an unknown key, an unknown role, a user or team named twice,
// a user in a team the file does not declare, a team admin who is not a user of the file or
// not a resource_admin or system_admin, or a file with no system admin.
Result<RolesConfig> LoadRolesFile(const std::string& path);
Result<RolesConfig> LoadRolesString(std::string_view text, std::string display_name);

}  // namespace kc::api
