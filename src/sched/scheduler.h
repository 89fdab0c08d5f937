// The scheduler: who uses which devices when. Event-driven: the owner reports what happened
// (a job arrives, ends, checkpoints or faults; devices go down or come back) and asks for a
// pass at a time; the pass returns decisions (start, preempt, shrink, grow, demote), each
// with its reason. The simulator (sched/simulator.h) drives it on virtual time; the control
// plane drives it on real time with the agents carrying the decisions out.
//
// Level 1 maps a job to its pool (by name, else the first pool whose classes and teams take
// it); level 2 places it inside the pool: priority level, then fair share between teams and
// users (decaying usage), then age; backfill (EASY: one reservation per pool, for its first
// blocked job, which backfill never delays); idle pools lend devices, and borrowed devices
// are preemptible; a high-priority job preempts preemptible jobs, choosing the victims that
// lose the least work, or shrinks elastic jobs toward their minimum instead.
// Design: docs/design/scheduler.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"
#include "sched/checkpoint_advice.h"
#include "sched/pools.h"

namespace kc::sched {

// What a job asks for. It names a device count range and a kind, never devices.
struct JobRequest {
  std::string id;  // unique among the scheduler's jobs
  std::string team;
  std::string user;
  JobClass job_class = JobClass::kNormal;
  int min_devices = 1;
  int max_devices = 1;
  int tp = 1;  // devices that must share a host; counts are multiples of it
  // All of its devices on one host, at every size it runs at (start, shrink, grow): its ranks
  // talk over shared memory. Its max_devices must fit a host.
  bool one_host = false;
  // Its size may change while it runs (shrink, grow). A job that is not (a command job: its
  // program cannot change its world size) starts at any size in [min_devices, max_devices]
  // and keeps it: it is preempted instead of shrunk, and not grown.
  bool resizable = true;
  std::string kind;  // a device model ("A100-SXM4-80GB") or kind ("cuda"); "" = any
  std::string pool;  // "" = level 1 chooses
  // Expected run time at max_devices (the job's time limit); its work is this times
  // max_devices device-seconds. 0: unknown (backfill then only gives it spare devices).
  double duration_s = 0;
  double checkpoint_cost_s = 60;  // what one checkpoint costs the job
};

enum class Policy : uint8_t {
  kKuangchao,  // pools, priorities, fair share, backfill, lending, preemption, elasticity
  kFifo,       // one queue in submit order, max devices or wait, nothing else (the baseline)
};
enum class CheckpointPolicy : uint8_t {
  kAdvised,   // CheckpointAdvisor's interval for the job's pool, class and borrowing
  kSeedRule,  // SeedRuleInterval: 7.5 min when preemption is likely, else 30 min
};

struct SchedulerOptions {
  Policy policy = Policy::kKuangchao;
  CheckpointPolicy checkpoint = CheckpointPolicy::kAdvised;
};

enum class DecisionKind : uint8_t {
  kStart,
  kPreempt,
  kShrink,
  kGrow,
  kDemote,
  kPromote,   // a starving job: scheduled at the normal level (SchedulerSettings::starve_after_s)
  kInterval,  // a new checkpoint interval for a running job (after its own faults)
};
std::string_view DecisionKindName(DecisionKind kind);  // "start", "preempt", ...

struct Decision {
  DecisionKind kind = DecisionKind::kStart;
  double time_s = 0;
  std::string job;
  // kStart, kShrink, kGrow: the job's devices from now on (indices into the topology).
  std::vector<int> devices;
  // kStart, kGrow: jobs that are releasing some of these devices (preempted or shrunk): the
  // executor starts this job once they have.
  std::vector<std::string> after;
  bool resume = false;    // kStart: from the job's last checkpoint
  bool borrowed = false;  // kStart: on another pool's devices, preemptibly
  std::string pool;       // the pool whose devices the job runs on
  // kPreempt: whether the victim can save within the grace period (else it loses the work
  // since its last checkpoint).
  bool save = false;
  double checkpoint_interval_s = 0;  // kStart, kShrink, kGrow, kInterval: the interval to apply
  int level = 0;                     // the job's priority level after the decision
  std::string reason;
};

enum class JobState : uint8_t { kPending, kRunning, kDone };

struct JobStatus {
  JobState state = JobState::kPending;
  std::vector<int> devices;
  std::string pool;      // its home pool
  std::string run_pool;  // where it runs ("" when pending)
  bool borrowed = false;
  int level = 0;
  int preemptions = 0;
  int faults = 0;
  std::string reason;  // pending: "pending: reason=Resources (...)", like Slurm's
};

// Not thread-safe: one owner feeds it events and runs its passes (the control plane does so
// from one queue). Times are seconds on the owner's clock, never decreasing.
class Scheduler {
 public:
  // Partitions `topology` into config's pools (PartitionPools' errors). The FIFO policy
  // ignores the pools and uses one queue over all devices. `topology` is not owned and must
  // outlive the scheduler.
  static Result<std::unique_ptr<Scheduler>> Create(const hal::Topology* topology,
                                                   const PoolConfig& config,
                                                   const SchedulerOptions& options);
  ~Scheduler();

  // A job arrives. kInvalidArgument, saying why, for a request it refuses at once: min above
  // max, a tp that does not divide them, an unknown device kind or pool, no pool for its
  // class and team, more devices than any pool it may use holds, or an id in use.
  Status Submit(const JobRequest& request, double now_s);
  // The job ended (done, cancelled or failed for good); its devices are free.
  Status Finished(std::string_view job, double now_s);
  // The job saved a checkpoint at now_s (which may be before the latest time reported): its
  // work up to then is safe from preemption.
  Status Checkpointed(std::string_view job, double now_s);
  // A process of the job failed; it restarts on its devices from its last checkpoint. Counts
  // toward its fault rate (demotion) and its pool's interruption rate (advice).
  Status Faulted(std::string_view job, double now_s);
  // Devices leave (failure, drain) or come back. A running job that loses devices shrinks
  // when it is elastic and keeps its minimum, else goes back to the queue.
  Status DevicesDown(const std::vector<int>& devices, double now_s);
  Status DevicesUp(const std::vector<int>& devices, double now_s);

  // A scheduling pass: the decisions since the last pass (demotions, reactions to devices
  // going down) and this pass's. O(pending log pending + devices) typically.
  std::vector<Decision> Schedule(double now_s);

  // kNotFound for an unknown job.
  Result<JobStatus> Query(std::string_view job) const;
  // The advised interval for a job of `pool`, `job_class`, borrowing or not, whose
  // checkpoint costs `cost_s`; kNotFound for an unknown pool.
  Result<CheckpointAdvice> Advice(std::string_view pool, JobClass job_class, bool borrowed,
                                  double cost_s) const;

  std::vector<Pool> pools() const;
  int num_pending() const;
  int num_running() const;

 private:
  struct Impl;
  explicit Scheduler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::sched
