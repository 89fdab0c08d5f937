// Reading the admin's communication limits file with kc::config, and job-name matching.
#include "comm/comm_limits_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/config.h"
#include "base/layer_guard.h"

namespace kc::comm {
namespace {

constexpr double kGb = 1e9;
constexpr double kMb = 1e6;
constexpr int64_t kKib = 1024;

// A positive, finite Double at `key`, or `fallback` when absent.
double PositiveDouble(config::Map& m, std::string_view key, double fallback, double min = 0) {
  const config::Range range =
      min > 0 ? config::Range{.min = min} : config::Range{.min = 0, .min_exclusive = true};
  const double v = m.OptionalDouble(key, fallback, range);
  if (std::isinf(v)) {
    m.Reject(key, "expected a finite number");
    return fallback;
  }
  return v;
}

// The keys of a rate limit; absent keys keep `fallback`'s values.
RateLimit ReadRateLimit(config::Map m, const RateLimit& fallback) {
  RateLimit limit;
  limit.ops_per_second = PositiveDouble(m, "ops_per_second", fallback.ops_per_second);
  limit.bytes_per_second =
      PositiveDouble(m, "bytes_per_second_gb", fallback.bytes_per_second / kGb) * kGb;
  limit.burst_ops = PositiveDouble(m, "burst_ops", fallback.burst_ops, /*min=*/1);
  limit.burst_bytes = PositiveDouble(m, "burst_mb", fallback.burst_bytes / kMb) * kMb;
  return limit;
}

LaneOptions ReadLanes(config::Map m) {
  LaneOptions lanes;
  lanes.chunk_bytes =
      m.OptionalInt("chunk_kib", lanes.chunk_bytes / kKib, config::InRange(1, 1 << 20)) * kKib;
  lanes.queue_chunks =
      m.OptionalInt("queue_chunks", lanes.queue_chunks, config::InRange(1, 1 << 24));
  lanes.low_lane_min_share =
      m.OptionalDouble("low_lane_min_share", lanes.low_lane_min_share, config::InRange(0, 0.5));
  if (!m.Has("priority")) return lanes;

  const std::vector<std::string> names = m.StringList("priority");
  if (names.size() != kNumLanes) {
    m.Reject("priority", "expected the 4 lanes gradient, activation, control, telemetry, " +
                             std::to_string(names.size()) + " given");
    return lanes;
  }
  std::array<bool, kNumLanes> seen{};
  std::array<Lane, kNumLanes> order{};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::optional<Lane> lane = LaneFromName(names[i]);
    if (!lane) {
      m.Reject("priority", "priority[" + std::to_string(i) + "]: unknown lane \"" + names[i] +
                               "\"; expected gradient, activation, control or telemetry");
      return lanes;
    }
    if (seen[static_cast<size_t>(*lane)]) {
      m.Reject("priority", "lane \"" + names[i] + "\" is named twice");
      return lanes;
    }
    seen[static_cast<size_t>(*lane)] = true;
    order[i] = *lane;
  }
  for (Lane lane : order) {
    if (lane == Lane::kGradient) break;
    if (lane == Lane::kTelemetry) {
      m.Reject("priority",
               "telemetry cannot rank above gradient (logging at top priority stalls gradient "
               "sync, the seed's incident 5.1)");
      return lanes;
    }
  }
  lanes.priority = order;
  return lanes;
}

Result<CommLimits> ParseCommLimits(config::Document doc) {
  CommLimits limits;
  config::Map root = doc.root();
  config::Map rates = root.OptionalMap("rate_limits");
  limits.default_limit = ReadRateLimit(rates.OptionalMap("default"), RateLimit{});
  std::unordered_map<std::string, size_t> first_index;
  std::vector<config::Map> jobs = rates.OptionalMapList("jobs");
  for (size_t i = 0; i < jobs.size(); ++i) {
    config::Map m = jobs[i];
    JobRateLimit job;
    job.pattern = m.String("job");
    if (m.Has("job")) {
      if (job.pattern.empty()) {
        m.Reject("job", "expected a job name or glob");
      } else if (auto [it, inserted] = first_index.emplace(job.pattern, i); !inserted) {
        m.Reject("job", "duplicate job pattern (first at rate_limits.jobs[" +
                            std::to_string(it->second) + "])");
      }
    }
    job.limit = ReadRateLimit(m, limits.default_limit);
    limits.jobs.push_back(std::move(job));
  }
  limits.lanes = ReadLanes(root.OptionalMap("lanes"));
  KC_RETURN_IF_ERROR(doc.Finish());
  // The reads above already enforce these rules with file positions; this is the backstop.
  KC_RETURN_IF_ERROR(ValidateLaneOptions(limits.lanes));
  KC_RETURN_IF_ERROR(ValidateRateLimit(limits.default_limit));
  for (const JobRateLimit& job : limits.jobs) KC_RETURN_IF_ERROR(ValidateRateLimit(job.limit));
  return limits;
}

}  // namespace

bool JobPatternMatches(std::string_view pattern, std::string_view name) {
  size_t p = 0;
  size_t n = 0;
  size_t star = std::string_view::npos;  // position after the last '*' seen
  size_t star_n = 0;                     // where that '*' started matching in name
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = ++p;
      star_n = n;
    } else if (star != std::string_view::npos) {
      // Let the last '*' absorb one more character and retry.
      p = star;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

RateLimit CommLimits::ForJob(std::string_view job_name) const {
  const RateLimit* best = &default_limit;
  // (exact, literal characters, -stars) of the best match so far; higher is more specific.
  std::tuple<bool, int64_t, int64_t> best_rank{false, -1, 0};
  for (const JobRateLimit& job : jobs) {
    if (!JobPatternMatches(job.pattern, job_name)) continue;
    const auto stars =
        static_cast<int64_t>(std::count(job.pattern.begin(), job.pattern.end(), '*'));
    const auto marks =
        static_cast<int64_t>(std::count(job.pattern.begin(), job.pattern.end(), '?'));
    const std::tuple<bool, int64_t, int64_t> rank{
        stars + marks == 0, static_cast<int64_t>(job.pattern.size()) - stars - marks, -stars};
    if (rank > best_rank) {
      best = &job.limit;
      best_rank = rank;
    }
  }
  return *best;
}

std::string FormatCommLimits(const CommLimits& limits) {
  const auto limit = [](const RateLimit& l) {
    return fmt::format(
        "{{ops_per_second: {}, bytes_per_second_gb: {}, burst_ops: {}, burst_mb: {}}}",
        l.ops_per_second, l.bytes_per_second / kGb, l.burst_ops, l.burst_bytes / kMb);
  };
  std::string out = "rate_limits:\n  default: " + limit(limits.default_limit) + "\n";
  if (!limits.jobs.empty()) {
    out += "  jobs:\n";
    for (const JobRateLimit& j : limits.jobs) {
      // A pattern is any string: quoted as JSON quotes it (YAML reads that).
      out += fmt::format("    - {{job: {}, {}\n", nlohmann::json(j.pattern).dump(),
                         limit(j.limit).substr(1));
    }
  }
  std::vector<std::string> priority;
  for (Lane lane : limits.lanes.priority) priority.emplace_back(LaneName(lane));
  out += fmt::format(
      "lanes:\n  chunk_kib: {}\n  queue_chunks: {}\n  low_lane_min_share: {}\n  priority: "
      "[{}]\n",
      limits.lanes.chunk_bytes / kKib, limits.lanes.queue_chunks, limits.lanes.low_lane_min_share,
      fmt::join(priority, ", "));
  return out;
}

std::string DescribeCommLimits(const RateLimit& limit, const LaneOptions& lanes) {
  std::vector<std::string> priority;
  for (Lane lane : lanes.priority) priority.emplace_back(LaneName(lane));
  return fmt::format(
      "{} ops/s, {} GB/s (bursts of {} ops, {} MB); lanes {}, {} KiB chunks, {}% kept for the "
      "lower lanes",
      limit.ops_per_second, limit.bytes_per_second / kGb, limit.burst_ops, limit.burst_bytes / kMb,
      fmt::join(priority, " > "), lanes.chunk_bytes / kKib, lanes.low_lane_min_share * 100);
}

Result<CommLimits> LoadCommLimits(const std::string& path) {
  KC_LAYER_ENTRY(Layer::kComm, "comm_limits");
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ParseCommLimits(std::move(doc));
}

Result<CommLimits> LoadCommLimitsString(std::string_view text, std::string display_name) {
  KC_LAYER_ENTRY(Layer::kComm, "comm_limits");
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ParseCommLimits(std::move(doc));
}

}  // namespace kc::comm
