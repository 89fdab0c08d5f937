// Synthetic job traces for `kc sim`, shaped after Microsoft's Philly GPU cluster (Jeon et al.,
// "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC
// 2019; trace: github.com/msr-fiddle/philly-traces). Sources and assumptions, figure by
// figure: docs/design/synthetic-traces.md.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "sched/trace.h"

namespace kc::sched {

// Share of jobs per size bucket, after Philly's buckets on its 8-GPU hosts (1, 2-4, 5-8,
// >8 GPUs): [0] one device; [1] a power of two in [2, devices_per_host); [2] one whole host;
// [3] 2^k whole hosts, k >= 1, with P(k) proportional to 2^-k. Sizes above
// floor(max_job_fraction * devices) are never drawn; a bucket left empty by that, or by a
// small devices_per_host, gives its share to the others in proportion.
inline constexpr std::array<double, 4> kSizeBucketShares = {0.80, 0.10, 0.07, 0.03};

// What to generate. Each field is the CLI flag --<field> with '-' for '_'
// (--devices-per-host); error messages name fields that way.
struct SyntheticTraceOptions {
  int jobs = 2000;           // rows to generate
  int devices = 256;         // size of the cluster the load is computed for
  int devices_per_host = 8;  // multi-host jobs ask for whole hosts (multiples of this)
  // Offered load: sum(duration_s * max_devices) / (devices * arrival span), where the span
  // runs from the first submit (0) to the last.
  double load = 1.0;
  uint64_t seed = 1;
  int teams = 6;                // teams "team0".., each with users "team0-u0".."team0-u2"
  double high_fraction = 0.05;  // class mix; the rest is "normal"
  // High priority is for urgent work (an assumption: Philly has no priority classes): a job
  // drawn high that asks for more devices (0: devices_per_host) or hours than these is normal.
  int high_max_devices = 0;
  double high_max_hours = 24;
  double preemptible_fraction = 0.30;
  // Of the jobs with max_devices > 1: min_devices = max/2 or max/4 (a valid size; see below).
  double elastic_fraction = 0.30;
  // An elastic job's min_devices as a share of its max_devices, in [0, 1): 0 draws max/2 or
  // max/4; otherwise max * ratio rounded down to a valid size (at least 1; whole hosts above
  // one host), and a job whose rounded minimum is its maximum stays rigid.
  double elastic_min_ratio = 0;
  // Relative weights of the size buckets (kSizeBucketShares); at least one positive. Raising
  // the last three raises the share of multi-device jobs.
  std::array<double, 4> size_mix = kSizeBucketShares;
  // Sigma of the log-normal run times (ln seconds); the per-bucket medians stay. Positive.
  double duration_sigma = 3.0;
  double max_job_fraction = 0.5;  // no job asks for more than this share of `devices`
  // The arrival rate follows rate * (1 + a*sin(2*pi*t/86400)): the daily peak is at 6 h,
  // the trough at 18 h. 0 gives plain Poisson arrivals. Must be in [0, 1).
  double diurnal_amplitude = 0.5;
  // Squared coefficient of variation of the gaps between arrivals (on the diurnal clock): 1
  // gives a Poisson process, more gives bursts (gamma-distributed gaps of shape
  // 1/burstiness), less gives evenly spaced arrivals. In (0, 100].
  double burstiness = 1;
};

// Generates `options.jobs` jobs, sorted by submit_s and named in that order ("job0000" to
// "job1999" for 2000 jobs). The first is submitted at 0, and arrivals are spread so the
// offered load equals options.load. Run times are log-normal per size bucket, clipped to
// [60 s, 14 days] and rounded to seconds. About 2% of jobs fail repeatedly (2-6 faults per
// hour); the rest never fail. kind and pool are empty, tp is 1 and checkpoint_s is -1.
// Deterministic: the same options give the same trace. Draws come from std::mt19937_64
// through our own transforms, not std::*_distribution, whose algorithms differ between
// standard libraries; traces therefore agree across libraries up to libm rounding.
// Returns kInvalidArgument naming the flag ("--jobs: must be at least 1, got 0") when a
// count is below 1, load is not a positive number, a fraction is outside [0, 1], high plus
// preemptible exceeds 1, max_job_fraction * devices is below 1 device, diurnal_amplitude or
// elastic_min_ratio is outside [0, 1), a size_mix weight is negative or all are 0 (or the
// buckets the options leave drawable all have weight 0), duration_sigma is not positive, or
// burstiness is outside (0, 100].
Result<std::vector<TraceJob>> GenerateSyntheticTrace(const SyntheticTraceOptions& options);

}  // namespace kc::sched
