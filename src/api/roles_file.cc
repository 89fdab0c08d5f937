#include "api/roles_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/config.h"

namespace kc::api {
namespace {

Result<RolesConfig> Read(config::Document doc) {
  RolesConfig out;
  config::Map root = doc.root();
  out.cluster = root.String("cluster");
  std::map<std::string, size_t> user_index;
  std::vector<config::Map> user_maps = root.RequiredMapList("users");
  for (config::Map m : user_maps) {
    UserSpec u;
    u.name = m.String("name");
    const std::string role =
        m.Choice("role", {"system_admin", "resource_admin", "submitter", "observer"});
    u.role = RoleFromName(role).value_or(Role::kObserver);
    u.teams = m.OptionalStringList("teams");
    if (u.name.empty()) m.Reject("name", "expected a user name");
    if (!user_index.emplace(u.name, out.users.size()).second) {
      m.Reject("name", "names a user listed before");
    }
    out.users.push_back(std::move(u));
  }
  std::set<std::string> team_names;
  for (config::Map m : root.OptionalMapList("teams")) {
    TeamSpec t;
    t.name = m.String("name");
    t.admins = m.OptionalStringList("admins");
    t.pool = m.OptionalString("pool", "");
    if (!team_names.insert(t.name).second) m.Reject("name", "names a team listed before");
    for (const std::string& a : t.admins) {
      auto it = user_index.find(a);
      if (it == user_index.end()) {
        m.Reject("admins", fmt::format("\"{}\" is not a user of this file", a));
      } else if (out.users[it->second].role != Role::kResourceAdmin &&
                 out.users[it->second].role != Role::kSystemAdmin) {
        m.Reject("admins", fmt::format("\"{}\" is a {}; a team admin is a resource_admin", a,
                                       RoleName(out.users[it->second].role)));
      }
    }
    out.teams.push_back(std::move(t));
  }
  for (size_t i = 0; i < out.users.size(); ++i) {
    for (const std::string& t : out.users[i].teams) {
      if (!team_names.contains(t)) {
        user_maps[i].Reject("teams", fmt::format("team \"{}\" is not declared under teams", t));
      }
    }
  }
  if (std::none_of(out.users.begin(), out.users.end(),
                   [](const UserSpec& u) { return u.role == Role::kSystemAdmin; })) {
    root.Reject("users", "expected at least one system_admin");
  }
  KC_RETURN_IF_ERROR(doc.Finish());
  return out;
}

}  // namespace

std::optional<Principal> RolesConfig::PrincipalFor(std::string_view user) const {
  for (const UserSpec& u : users) {
    if (u.name != user) continue;
    Principal p{.user = u.name, .role = u.role, .teams = u.teams, .admin_of = {}};
    for (const TeamSpec& t : teams) {
      if (std::find(t.admins.begin(), t.admins.end(), u.name) != t.admins.end()) {
        p.admin_of.push_back(t.name);
      }
    }
    return p;
  }
  return std::nullopt;
}

Result<RolesConfig> LoadRolesFile(const std::string& path) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return Read(std::move(doc));
}

Result<RolesConfig> LoadRolesString(std::string_view text, std::string display_name) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return Read(std::move(doc));
}

}  // namespace kc::api
