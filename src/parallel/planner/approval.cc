#include "parallel/planner/approval.h"

#include <fmt/format.h>

#include "base/config.h"

namespace kc::parallel::planner {
namespace {

Result<ApprovalLimits> ParseLimits(config::Document doc) {
  config::Map root = doc.root();
  const config::Range positive{.min = 0, .min_exclusive = true};
  ApprovalLimits l;
  l.max_devices = static_cast<int>(root.OptionalInt("max_devices", 0, {.min = 1, .max = 1 << 30}));
  l.max_memory_bytes_per_device =
      root.OptionalDouble("max_memory_gb_per_device", 0, positive) * 1e9;
  l.max_comm_bytes_per_step = root.OptionalDouble("max_comm_gb_per_step", 0, positive) * 1e9;
  l.max_runtime_s = root.OptionalDouble("max_runtime_hours", 0, positive) * 3600;
  KC_RETURN_IF_ERROR(doc.Finish());
  return l;
}

}  // namespace

Result<ApprovalLimits> LoadApprovalLimits(const std::string& path) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ParseLimits(std::move(doc));
}

Result<ApprovalLimits> LoadApprovalLimitsFromString(std::string_view text,
                                                    std::string display_name) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ParseLimits(std::move(doc));
}

ApprovalVerdict CheckApproval(const ParallelPlan& plan, const PlanEstimate& estimate, int64_t steps,
                              const ApprovalLimits& limits) {
  ApprovalVerdict v;
  v.devices = plan.t * plan.p * plan.d;
  v.memory_bytes_per_device = estimate.memory.total;
  v.comm_bytes_per_step =
      (estimate.tp.bytes_per_step + estimate.pp.bytes_per_step + estimate.dp.bytes_per_step) *
      v.devices;
  v.steps = steps;
  v.runtime_s = steps > 0 ? estimate.step_time_s * static_cast<double>(steps) : 0;
  if (limits.max_devices > 0 && v.devices > limits.max_devices) {
    v.reasons.push_back(
        fmt::format("{} devices, above the limit of {}", v.devices, limits.max_devices));
  }
  if (limits.max_memory_bytes_per_device > 0 &&
      v.memory_bytes_per_device > limits.max_memory_bytes_per_device) {
    v.reasons.push_back(fmt::format("{:.2f} GB per device, above the limit of {:.2f} GB",
                                    v.memory_bytes_per_device / 1e9,
                                    limits.max_memory_bytes_per_device / 1e9));
  }
  if (limits.max_comm_bytes_per_step > 0 &&
      v.comm_bytes_per_step > limits.max_comm_bytes_per_step) {
    v.reasons.push_back(
        fmt::format("{:.2f} GB of communication per step, above the limit of "
                    "{:.2f} GB",
                    v.comm_bytes_per_step / 1e9, limits.max_comm_bytes_per_step / 1e9));
  }
  if (limits.max_runtime_s > 0) {
    if (steps <= 0) {
      v.reasons.push_back(
          fmt::format("expected runtime unknown (no step count given), the limit is {:.2f} h",
                      limits.max_runtime_s / 3600));
    } else if (v.runtime_s > limits.max_runtime_s) {
      v.reasons.push_back(
          fmt::format("{:.2f} h expected for {} steps, above the limit of "
                      "{:.2f} h",
                      v.runtime_s / 3600, steps, limits.max_runtime_s / 3600));
    }
  }
  v.required = !v.reasons.empty();
  return v;
}

}  // namespace kc::parallel::planner
