// Checkpoint-interval advice: how often a job should checkpoint, from how often jobs like it
// (same pool, class, and whether on borrowed devices) were interrupted by preemptions and
// faults. The fault layer applies the interval (fault::RunnerOptions::mtbf_s takes the mean
// time between interruptions this estimates).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace kc::sched {

// Young's first-order interval sqrt(2 C M): minimises the expected work lost to an
// interruption plus the checkpoints' cost, for a checkpoint costing `cost_s` and a mean time
// between interruptions `mtbi_s`. 0 when either is not positive.
double YoungDalyInterval(double cost_s, double mtbi_s);

// Daly's higher-order refinement (2006): sqrt(2CM) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C for
// C < 2M, else M. Better than Young's when C is not small against M.
double DalyInterval(double cost_s, double mtbi_s);

// The seed rule the advice is measured against: every 7.5 minutes (the middle of "5-10")
// when preemption is likely, every 30 minutes when not.
double SeedRuleInterval(bool preemption_likely);

// What the advisor estimates for one kind of job.
struct CheckpointAdvice {
  double mtbi_s = 0;          // estimated mean time between interruptions while running
  double interval_s = 0;      // DalyInterval(cost, mtbi_s)
  int64_t interruptions = 0;  // observed (preemptions + faults)
  double exposure_s = 0;      // observed job-seconds of running
};

// Estimates interruption rates per (pool, class, borrowed) from the event history: observed
// interruptions over observed running time, with a prior worth one interruption whose mean
// time is what the seed rule implies for a 60 s checkpoint (so a key with no history gets the
// seed rule's interval, and the history takes over as it grows). Not thread-safe; owned by
// the scheduler.
class CheckpointAdvisor {
 public:
  struct Key {
    int pool = 0;
    int job_class = 0;
    bool borrowed = false;
    auto operator<=>(const Key&) const = default;
  };
  // `preemption_likely(key)` decides the prior: class preemptible or borrowed devices.
  static bool PreemptionLikely(const Key& key) { return key.job_class == 0 || key.borrowed; }

  void AddExposure(const Key& key, double job_seconds) { stats_[key].exposure_s += job_seconds; }
  void AddInterruption(const Key& key) { ++stats_[key].interruptions; }
  CheckpointAdvice Advise(const Key& key, double cost_s) const;

 private:
  struct Stats {
    int64_t interruptions = 0;
    double exposure_s = 0;
  };
  std::map<Key, Stats> stats_;
};

}  // namespace kc::sched
