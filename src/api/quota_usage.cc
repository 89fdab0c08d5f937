#include "api/quota_usage.h"

namespace kc::api {

QuotaUsage UsageOf(std::span<const JobRecord> jobs, QuotaSubject subject, std::string_view name) {
  QuotaUsage u;
  if (name.empty()) return u;
  for (const JobRecord& j : jobs) {
    if ((subject == QuotaSubject::kUser ? j.owner : j.team) != name) continue;
    if (!IsTerminal(j.phase)) u.devices += j.devices;
    // A job that may still run holds the hours it asked for; an ended one, those it used.
    u.device_hours +=
        IsTerminal(j.phase) ? static_cast<double>(j.devices) * j.ran_s / 3600 : j.device_hours;
    u.storage_gb += j.storage_gb;
  }
  return u;
}

}  // namespace kc::api
