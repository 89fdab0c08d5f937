#include "sched/checkpoint_advice.h"

#include <algorithm>
#include <cmath>

namespace kc::sched {
namespace {
// The checkpoint cost the prior assumes: the seed rule's intervals are Young's for it.
constexpr double kPriorCostS = 60;
}  // namespace

double YoungDalyInterval(double cost_s, double mtbi_s) {
  return std::sqrt(2.0 * std::max(cost_s, 0.0) * std::max(mtbi_s, 0.0));
}

double DalyInterval(double cost_s, double mtbi_s) {
  if (!(cost_s > 0) || !(mtbi_s > 0)) return 0;
  if (cost_s >= 2 * mtbi_s) return mtbi_s;
  const double x = cost_s / (2 * mtbi_s);
  return std::sqrt(2 * cost_s * mtbi_s) * (1 + std::sqrt(x) / 3 + x / 9) - cost_s;
}

double SeedRuleInterval(bool preemption_likely) { return preemption_likely ? 450 : 1800; }

CheckpointAdvice CheckpointAdvisor::Advise(const Key& key, double cost_s) const {
  // Prior: one interruption per M0, where Young's interval for kPriorCostS is the seed rule's.
  const double seed = SeedRuleInterval(PreemptionLikely(key));
  const double prior_mtbi = seed * seed / (2 * kPriorCostS);
  CheckpointAdvice a;
  if (auto it = stats_.find(key); it != stats_.end()) {
    a.interruptions = it->second.interruptions;
    a.exposure_s = it->second.exposure_s;
  }
  a.mtbi_s = (a.exposure_s + prior_mtbi) / static_cast<double>(a.interruptions + 1);
  a.interval_s = DalyInterval(cost_s, a.mtbi_s);
  return a;
}

}  // namespace kc::sched
