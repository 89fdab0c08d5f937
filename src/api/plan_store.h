// The plan kcd's planner chose for each job, with its estimates and whether it passed the
// cluster's approval limits (DIR/plan-approval.yaml), and a resource admin's decision on it.
// In kcd's database, beside the jobs. Docs: docs/operations/approvals.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::api {

struct PlanRecord {
  int64_t job = 0;
  std::string plan_yaml;  // "" when the planner found none (`summary` says why)
  std::string summary;    // the estimates in words: devices, step time, memory, traffic
  bool approval_required = false;
  std::vector<std::string> reasons;  // the limits it passes, with the figures
  std::string decision;              // "", "approved" or "denied"
  std::string decided_by;
  std::string note;
  double decided_s = 0;
};

// Safe for concurrent use.
class PlanStore {
 public:
  // kUnavailable naming the file when it cannot be opened.
  static Result<std::unique_ptr<PlanStore>> Open(const std::string& path);
  ~PlanStore();
  PlanStore(const PlanStore&) = delete;
  PlanStore& operator=(const PlanStore&) = delete;

  // Records (or replaces) a job's plan, undecided.
  Status Put(const PlanRecord& plan);
  // kNotFound when job `job` has no plan (yet).
  Result<PlanRecord> Get(int64_t job) const;
  // Records the decision once: kFailedPrecondition, saying who decided, for a plan decided
  // already or one that needs no approval.
  Result<PlanRecord> Decide(int64_t job, bool approve, std::string_view admin,
                            std::string_view note, double now_s);

 private:
  struct Impl;
  explicit PlanStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kc::api
