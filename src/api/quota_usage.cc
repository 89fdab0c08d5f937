#include "api/quota_usage.h"

namespace kc::api {

QuotaUsage UsageOf(std::span<const JobRecord> jobs, QuotaSubject subject, std::string_view name) {
  QuotaUsage u;
  if (name.empty()) return u;
  for (const JobRecord& j : jobs) {
    if ((subject == QuotaSubject::kUser ? j.owner : j.team) != name) continue;
    if (!IsTerminal(j.phase)) u.devices += j.devices;
    u.device_hours += j.device_hours;
    u.storage_gb += j.storage_gb;
  }
  return u;
}

}  // namespace kc::api
