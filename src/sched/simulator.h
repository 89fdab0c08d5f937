// The trace-driven simulator behind `kc sim`: replays a trace through the real Scheduler on
// virtual time and measures what it did. Jobs progress at one device-second of work per
// device per second, checkpoint at the interval each start decision gives (each checkpoint
// pauses them for their checkpoint cost), lose the work since their last checkpoint to a
// fault or to a preemption whose save does not fit the grace period, and pay a restart (their
// checkpoint cost again) on resuming. Model and metrics: docs/operations/scheduling.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"
#include "sched/pools.h"
#include "sched/scheduler.h"
#include "sched/trace.h"

namespace kc::sched {

struct SimOptions {
  SchedulerOptions scheduler;
  double checkpoint_cost_s = 60;  // for jobs whose trace row gives none
  uint64_t seed = 1;              // fault arrival draws
  int curve_points = 200;         // points of the utilisation curve
};

// Per-job times in seconds: how many jobs, their mean and percentiles.
struct TimeStats {
  int jobs = 0;
  double mean_s = 0;
  double p50_s = 0;
  double p95_s = 0;
  double max_s = 0;
};

// The checkpoint advice the history of a run gives, for one kind of job.
struct AdviceRow {
  std::string pool;
  std::string job_class;
  bool borrowed = false;
  CheckpointAdvice advice;  // for SimOptions::checkpoint_cost_s
};

struct SimReport {
  int jobs = 0;
  int finished = 0;
  std::vector<std::string> refused;     // "job: reason"
  std::vector<std::string> unfinished;  // "job: pending reason" for jobs that never ended
  // The run stopped at its time limit (the last submit + 20x the trace's work spread over
  // the devices + 30 days): some job could not finish.
  bool hit_time_limit = false;
  double makespan_s = 0;      // last end
  double arrivals_end_s = 0;  // last submit
  // Devices held by jobs (running, checkpointing, restarting, saving for a preemption) over
  // all devices: while jobs arrive (0 to the last submit), and to the last end.
  double utilisation_arrivals = 0;
  double utilisation = 0;
  // The work of the jobs that finished over all device time to the last end.
  double useful_utilisation = 0;
  std::map<std::string, TimeStats> delay;  // queueing delay (submit to first start) by class
  // Job completion time (submit to end) of the jobs that finished, by class and over all
  // of them ("all").
  std::map<std::string, TimeStats> completion;
  int preemptions = 0;
  int shrinks = 0;
  int grows = 0;
  int demotions = 0;
  int promotions = 0;  // starving jobs scheduled at the normal level
  int faults = 0;
  // Device-hours: work redone and grace time spent because of preemptions (shrinks lose
  // nothing but their reconfiguration pause, counted here too), work redone after faults,
  // periodic checkpoints, restarts.
  double lost_preemption_h = 0;
  double lost_fault_h = 0;
  double checkpoint_h = 0;
  // The part of checkpoint_h taken while running preemptibly (class preemptible or on
  // borrowed devices): what insures against preemption. With lost_preemption_h, the cost of
  // preemption that the checkpoint interval trades off.
  double checkpoint_exposed_h = 0;
  double restart_h = 0;
  // Time-averaged share of free devices that sit on hosts partly used by jobs.
  double fragmentation = 0;
  // Jain's index over teams of their jobs' mean (run time at max devices / time in system).
  double fairness = 0;
  // Wall time of the scheduling passes.
  int passes = 0;
  int max_pending = 0;
  double decision_p50_ms = 0;
  double decision_p99_ms = 0;
  double decision_max_ms = 0;
  // The same, by how many jobs were pending after the pass: [0, 100), [100, 1000),
  // [1000, 5000), 5000 and more.
  struct LatencyBucket {
    int min_pending = 0;
    int passes = 0;
    double p50_ms = 0;
    double p99_ms = 0;
    double max_ms = 0;
  };
  std::vector<LatencyBucket> latency_by_pending;
  std::vector<std::pair<double, double>> curve;  // (time s, devices held / devices), binned
  std::vector<AdviceRow> advice;                 // every (pool, class, borrowed) that ran
};

// Runs the trace. kInvalidArgument for a pool configuration that does not fit the cluster
// (PartitionPools). Refused jobs are reported, not errors. `on_decision`, if set, sees every
// decision in order. Deterministic for a seed, except the decision wall times.
Result<SimReport> Simulate(const hal::Topology& topology, const PoolConfig& pools,
                           const std::vector<TraceJob>& trace, const SimOptions& options,
                           const std::function<void(const Decision&)>& on_decision = nullptr);

}  // namespace kc::sched
