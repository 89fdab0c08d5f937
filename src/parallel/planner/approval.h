// The approval threshold (seed §2.3): a plan past a resource admin's limits on devices,
// memory per device, communication volume or expected runtime is marked "approval required",
// with the estimates the admin decides on. The workflow (who approves, where it waits) is the
// control plane's; this is the rule and the numbers. docs/user-guide/plan.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "parallel/plan.h"
#include "parallel/planner/cost_model.h"

namespace kc::parallel::planner {

// 0 in any field: no limit on that figure.
struct ApprovalLimits {
  int max_devices = 0;
  double max_memory_bytes_per_device = 0;  // the plan's predicted peak per device
  double max_comm_bytes_per_step = 0;      // bytes all devices send per step, every group
  double max_runtime_s = 0;                // predicted step time times the steps
};

// Reads a limits file: max_devices, max_memory_gb_per_device, max_comm_gb_per_step,
// max_runtime_hours, each optional and positive. Errors as "FILE:LINE: key: what".
Result<ApprovalLimits> LoadApprovalLimits(const std::string& path);
Result<ApprovalLimits> LoadApprovalLimitsFromString(std::string_view text,
                                                    std::string display_name);

struct ApprovalVerdict {
  bool required = false;
  std::vector<std::string> reasons;  // one per limit passed, with the figure and the limit
  // What the admin decides on.
  int devices = 0;
  double memory_bytes_per_device = 0;
  double comm_bytes_per_step = 0;  // all devices
  int64_t steps = 0;               // 0: not given
  double runtime_s = 0;            // 0 when steps is 0
};

// Checks `plan` and its estimate for `steps` steps (0: unknown) against `limits`. A runtime
// limit with unknown steps requires approval: the runtime cannot be shown to be within it.
ApprovalVerdict CheckApproval(const ParallelPlan& plan, const PlanEstimate& estimate, int64_t steps,
                              const ApprovalLimits& limits);

}  // namespace kc::parallel::planner
