// The admin's communication limits file: per-job rate limits and the lane settings, read
// with kc::config (strict: unknown keys and bad values are FILE:LINE errors). Only the
// admin's file sets these values; a job cannot supply its own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "comm/lanes.h"
#include "comm/rate_limit.h"

namespace kc::comm {

// The rate limit of the jobs whose name matches `pattern`: an exact name ("team-a/train")
// or a glob where `*` matches any run of characters ('/' included) and `?` one character.
struct JobRateLimit {
  std::string pattern;
  RateLimit limit;  // keys the entry leaves out are taken from the default
};

// The admin's limits. A plain copyable value.
struct CommLimits {
  RateLimit default_limit;
  std::vector<JobRateLimit> jobs;  // in file order
  LaneOptions lanes;

  // The limit for `job_name`: the most specific matching entry, or default_limit when none
  // matches. An exact name beats any glob; among globs, more literal characters win, then
  // fewer `*`, then the earlier entry.
  RateLimit ForJob(std::string_view job_name) const;
};

// Whether `name` matches the glob `pattern` (`*` any run, `?` one character, the rest
// literal).
bool JobPatternMatches(std::string_view pattern, std::string_view name);

// `limits` as a limits file LoadCommLimitsString reads back to the same values (kcd hands each
// job's agent its own: the job's limit as the default, and the lanes).
std::string FormatCommLimits(const CommLimits& limits);
// One line for people: "2000 ops/s, 2.5 GB/s (bursts of 1000 ops, 256 MB); lanes gradient >
// activation > control > telemetry, 256 KiB chunks, 5% kept for the lower lanes".
std::string DescribeCommLimits(const RateLimit& limit, const LaneOptions& lanes);

// Reads the admin's limits file at `path`:
//
//   rate_limits:
//     default: {ops_per_second: 10000, bytes_per_second_gb: 10, burst_ops: 1000, burst_mb: 256}
//     jobs:
//       - {job: "team-a/*", ops_per_second: 2000, bytes_per_second_gb: 2.5}
//   lanes:
//     chunk_kib: 256
//     queue_chunks: 1024
//     low_lane_min_share: 0.05
//     priority: [gradient, activation, control, telemetry]
//
// Every key is optional; absent ones keep the defaults of RateLimit and LaneOptions. Units
// are in the key names: GB = 10^9 bytes, MB = 10^6 bytes, KiB = 1024 bytes. Returns kNotFound
// if the file does not exist, and kInvalidArgument as "FILE:LINE: key.path: what" for an
// unknown key, a rate or burst that is not positive, a duplicate or empty job pattern, a
// priority that is not a permutation of the lanes, or telemetry ranked above gradient.
// Blocks on file I/O only.
Result<CommLimits> LoadCommLimits(const std::string& path);
// As LoadCommLimits, for YAML text in memory; `display_name` stands for the file in errors.
Result<CommLimits> LoadCommLimitsString(std::string_view text, std::string display_name);

}  // namespace kc::comm
