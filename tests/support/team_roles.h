// Test support: the roles file the permission tests share. Two teams: vision, which vera
// administers and ann and abe are in, and nlp, which bob is in and of which vera is a member,
// not an admin; root is the system admin, olga an observer. Header-only.
#pragma once

namespace kc::testing {

inline constexpr char kTeamRoles[] = R"(
cluster: c
users:
  - {name: root, role: system_admin}
  - {name: vera, role: resource_admin, teams: [vision, nlp]}
  - {name: ann, role: submitter, teams: [vision]}
  - {name: abe, role: submitter, teams: [vision]}
  - {name: bob, role: submitter, teams: [nlp]}
  - {name: olga, role: observer}
teams:
  - {name: vision, admins: [vera]}
  - {name: nlp}
)";

}  // namespace kc::testing
