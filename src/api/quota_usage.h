// What a user's or a team's jobs use, counted as quotas count it: the job service checks a
// submission against it and the quota service reports it.
#pragma once

#include <span>
#include <string_view>

#include "api/job_store.h"
#include "api/quotas.h"

namespace kc::api {

// The usage of `subject` `name` among `jobs`: devices of its jobs that have not ended; the
// device-hours its jobs that may still run asked for, and those its ended jobs ran; storage of
// all of them. A user's jobs are those it owns, a team's those
// submitted for it. An empty name uses nothing.
QuotaUsage UsageOf(std::span<const JobRecord> jobs, QuotaSubject subject, std::string_view name);

}  // namespace kc::api
