// The roles file (kcd's roles.yaml, kc token): who is who, or an error naming line and key.
#include "api/roles_file.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kc::Result<kc::api::RolesConfig> roles =
      kc::api::LoadRolesString(kc::fuzz::Text(data, size), "roles.yaml");
  if (!roles.ok()) return 0;
  for (const kc::api::UserSpec& u : roles->users) roles->PrincipalFor(u.name);
  return 0;
}
