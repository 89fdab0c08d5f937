// Synthetic Philly-like traces. Every constant here is listed, with its source or marked as
// an assumption, in docs/design/synthetic-traces.md.
#include "sched/trace_gen.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kc::sched {
namespace {

// Run time: log-normal per size bucket (median; sigma is an option, 3.0 by default), clipped.
// With the default sigma the mix has a median near 26 min and a 90th percentile near 25 h.
constexpr double kMedianDurationS[4] = {20 * 60, 45 * 60, 2 * 3600, 6 * 3600};
constexpr double kMinDurationS = 60;
constexpr double kMaxDurationS = 14 * 86400;
// Jobs that fail over and over, and their fault rate while running.
constexpr double kBuggyFraction = 0.02;
constexpr double kBuggyMinFaultsPerHour = 2;
constexpr double kBuggyMaxFaultsPerHour = 6;
constexpr int kUsersPerTeam = 3;
constexpr double kDayS = 86400;

// Random draws with fixed transforms of std::mt19937_64, which the standard pins down
// exactly. Not thread-safe.
class Draw {
 public:
  explicit Draw(uint64_t seed) : engine_(seed) {}

  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double Exponential() { return -std::log1p(-Uniform()); }  // mean 1
  double Normal() {                                         // Box-Muller; one value per call
    double r = std::sqrt(-2 * std::log(1 - Uniform()));
    return r * std::cos(2 * std::numbers::pi * Uniform());
  }
  // Gamma(shape, 1), mean `shape`: Marsaglia and Tsang's method, with Gamma(k + 1) * U^(1/k)
  // for a shape k below 1. REQUIRES: shape > 0.
  double Gamma(double shape) {
    if (shape < 1) return Gamma(shape + 1) * std::pow(1 - Uniform(), 1 / shape);
    const double d = shape - 1.0 / 3, c = 1 / std::sqrt(9 * d);
    for (;;) {
      double x = Normal(), v = 1 + c * x;
      if (v <= 0) continue;
      v = v * v * v;
      const double u = 1 - Uniform();  // (0, 1]
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }
  // Index i with probability weights[i] / sum(weights). REQUIRES: a positive weight.
  size_t Pick(std::span<const double> weights) {
    double total = 0;
    for (double w : weights) total += w;
    double x = Uniform() * total;
    size_t last = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (weights[i] <= 0) continue;
      if (x < weights[i]) return i;
      x -= weights[i];
      last = i;
    }
    return last;  // rounding left x at the end
  }

 private:
  std::mt19937_64 engine_;
};

// The sizes a bucket of kSizeBucketShares may draw, with relative weights.
struct Bucket {
  std::vector<int> sizes;
  std::vector<double> weights;
};

std::array<Bucket, 4> SizeBuckets(int devices_per_host, int max_size) {
  std::array<Bucket, 4> b;
  b[0] = {{1}, {1}};
  for (int s = 2; s < devices_per_host && s <= max_size; s *= 2) {
    b[1].sizes.push_back(s);
    b[1].weights.push_back(1);
  }
  if (devices_per_host > 1 && devices_per_host <= max_size) b[2] = {{devices_per_host}, {1}};
  double w = 0.5;
  for (int64_t s = 2 * int64_t{devices_per_host}; s <= max_size; s *= 2, w /= 2) {
    b[3].sizes.push_back(static_cast<int>(s));
    b[3].weights.push_back(w);
  }
  return b;
}

// With ratio 0: max/2 or max/4, whichever divide max and are themselves valid sizes (at most
// one host, or whole hosts); max itself when neither is. Otherwise max * ratio rounded down to
// a valid size, at least 1.
int ElasticMin(int max_devices, int devices_per_host, double ratio, Draw& draw) {
  if (ratio > 0) {
    int c = std::max(1, static_cast<int>(std::floor(max_devices * ratio + 1e-9)));
    if (c > devices_per_host) c -= c % devices_per_host;
    return std::min(c, max_devices);
  }
  std::vector<int> candidates;
  for (int d : {2, 4}) {
    int c = max_devices / d;
    if (max_devices % d == 0 && (c <= devices_per_host || c % devices_per_host == 0)) {
      candidates.push_back(c);
    }
  }
  if (candidates.empty()) return max_devices;
  return candidates[static_cast<size_t>(draw.Uniform() * candidates.size())];
}

// Cumulative arrival intensity in units of the mean rate: the integral of
// 1 + a*sin(2*pi*s/day) from 0 to t. Strictly increasing for a < 1.
double DiurnalClock(double t, double a) {
  return t + a * kDayS / (2 * std::numbers::pi) * (1 - std::cos(2 * std::numbers::pi * t / kDayS));
}

// The t with DiurnalClock(t, a) == y, by bisection: t lies in [y - a*day/pi, y].
double InverseDiurnalClock(double y, double a) {
  double lo = std::max(0.0, y - a * kDayS / std::numbers::pi), hi = y;
  for (int i = 0; i < 100 && hi - lo > 1e-6; ++i) {
    double mid = (lo + hi) / 2;
    (DiurnalClock(mid, a) < y ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

Status Bad(std::string_view flag, std::string_view what) {
  return InvalidArgumentError(std::string(flag) + ": " + std::string(what));
}

Status Validate(const SyntheticTraceOptions& o) {
  for (auto [flag, value] : {std::pair{"--jobs", o.jobs},
                             {"--devices", o.devices},
                             {"--devices-per-host", o.devices_per_host},
                             {"--teams", o.teams}}) {
    if (value < 1) return Bad(flag, "must be at least 1, got " + std::to_string(value));
  }
  if (!(o.load > 0) || !std::isfinite(o.load)) {
    return Bad("--load", "must be a positive number, got " + std::to_string(o.load));
  }
  for (auto [flag, value] : {std::pair{"--high-fraction", o.high_fraction},
                             {"--preemptible-fraction", o.preemptible_fraction},
                             {"--elastic-fraction", o.elastic_fraction},
                             {"--max-job-fraction", o.max_job_fraction}}) {
    if (!(value >= 0 && value <= 1)) {
      return Bad(flag, "must be in [0, 1], got " + std::to_string(value));
    }
  }
  if (o.high_fraction + o.preemptible_fraction > 1) {
    return Bad("--high-fraction", "plus --preemptible-fraction must be at most 1, got " +
                                      std::to_string(o.high_fraction + o.preemptible_fraction));
  }
  if (o.max_job_fraction * o.devices + 1e-9 < 1) {
    return Bad("--max-job-fraction",
               "allows no job of even 1 device on " + std::to_string(o.devices) + " devices");
  }
  if (o.high_max_devices < 0) {
    return Bad("--high-max-devices",
               "must not be negative, got " + std::to_string(o.high_max_devices));
  }
  if (!(o.high_max_hours > 0)) {
    return Bad("--high-max-hours", "must be positive, got " + std::to_string(o.high_max_hours));
  }
  for (auto [flag, value] : {std::pair{"--diurnal-amplitude", o.diurnal_amplitude},
                             {"--elastic-min-ratio", o.elastic_min_ratio}}) {
    if (!(value >= 0 && value < 1)) {
      return Bad(flag, "must be in [0, 1), got " + std::to_string(value));
    }
  }
  double mix = 0;
  for (double w : o.size_mix) {
    if (!(w >= 0) || !std::isfinite(w)) {
      return Bad("--size-mix", "weights must be non-negative numbers, got " + std::to_string(w));
    }
    mix += w;
  }
  if (!(mix > 0)) return Bad("--size-mix", "needs a positive weight");
  if (!(o.duration_sigma > 0) || !std::isfinite(o.duration_sigma)) {
    return Bad("--duration-sigma", "must be positive, got " + std::to_string(o.duration_sigma));
  }
  if (!(o.burstiness > 0 && o.burstiness <= 100)) {
    return Bad("--burstiness", "must be in (0, 100], got " + std::to_string(o.burstiness));
  }
  return OkStatus();
}

}  // namespace

Result<std::vector<TraceJob>> GenerateSyntheticTrace(const SyntheticTraceOptions& options) {
  KC_RETURN_IF_ERROR(Validate(options));
  const SyntheticTraceOptions& o = options;
  const int max_size = static_cast<int>(std::floor(o.max_job_fraction * o.devices + 1e-9));
  const std::array<Bucket, 4> buckets = SizeBuckets(o.devices_per_host, max_size);
  std::array<double, 4> bucket_shares{};
  for (size_t i = 0; i < 4; ++i) {
    if (!buckets[i].sizes.empty()) bucket_shares[i] = o.size_mix[i];
  }
  if (bucket_shares[0] + bucket_shares[1] + bucket_shares[2] + bucket_shares[3] <= 0) {
    return Bad("--size-mix", "gives no weight to a size these options allow");
  }
  std::vector<double> team_weights;  // a few big teams, many small ones
  for (int t = 0; t < o.teams; ++t) team_weights.push_back(1.0 / (t + 1));
  const int name_width = static_cast<int>(std::to_string(o.jobs - 1).size());

  Draw draw(o.seed);
  std::vector<TraceJob> jobs(static_cast<size_t>(o.jobs));
  double work = 0;  // device-seconds
  for (size_t i = 0; i < jobs.size(); ++i) {
    TraceJob& job = jobs[i];
    std::string index = std::to_string(i);
    job.job =
        "job" + std::string(std::max(0, name_width - static_cast<int>(index.size())), '0') + index;
    // Size: a bucket, then a size in it.
    size_t b = draw.Pick(bucket_shares);
    job.max_devices = buckets[b].sizes[draw.Pick(buckets[b].weights)];
    job.min_devices = job.max_devices;
    // Run time at max_devices.
    double d = kMedianDurationS[b] * std::exp(o.duration_sigma * draw.Normal());
    job.duration_s = std::round(std::clamp(d, kMinDurationS, kMaxDurationS));
    work += job.duration_s * job.max_devices;
    // Class, elasticity, faults, owner.
    double c = draw.Uniform();
    job.job_class = c < o.high_fraction                            ? "high"
                    : c < o.high_fraction + o.preemptible_fraction ? "preemptible"
                                                                   : "normal";
    // High priority is for urgent work: a drawn job too large or too long for it is normal.
    const int high_max = o.high_max_devices > 0 ? o.high_max_devices : o.devices_per_host;
    if (job.job_class == "high" &&
        (job.max_devices > high_max || job.duration_s > o.high_max_hours * 3600)) {
      job.job_class = "normal";
    }
    if (job.max_devices > 1 && draw.Uniform() < o.elastic_fraction) {
      job.min_devices = ElasticMin(job.max_devices, o.devices_per_host, o.elastic_min_ratio, draw);
    }
    if (draw.Uniform() < kBuggyFraction) {
      job.faults_per_hour = draw.Uniform(kBuggyMinFaultsPerHour, kBuggyMaxFaultsPerHour);
    }
    job.team = "team" + std::to_string(draw.Pick(team_weights));
    job.user = job.team + "-u" + std::to_string(static_cast<int>(draw.Uniform() * kUsersPerTeam));
  }

  // Arrivals: a renewal process on the diurnal clock (Poisson for burstiness 1), conditioned
  // on its last arrival being at the span that makes the offered load exact; job 0 arrives
  // at 0. Gaps are Gamma(1/burstiness): their squared coefficient of variation is burstiness.
  std::vector<double> clock(jobs.size(), 0);
  for (size_t i = 1; i < jobs.size(); ++i) {
    clock[i] =
        clock[i - 1] + (o.burstiness == 1 ? draw.Exponential() : draw.Gamma(1 / o.burstiness));
  }
  const double span_s = work / (o.devices * o.load);
  const double scale =
      clock.back() > 0 ? DiurnalClock(span_s, o.diurnal_amplitude) / clock.back() : 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    double t = InverseDiurnalClock(clock[i] * scale, o.diurnal_amplitude);
    jobs[i].submit_s = std::round(t * 1000) / 1000;
  }
  return jobs;
}

}  // namespace kc::sched
