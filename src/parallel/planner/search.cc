#include "parallel/planner/search.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "parallel/engine_support.h"

namespace kc::parallel::planner {
namespace {

// Why `alt` lost to `best`: memory-wise it fits, so it is slower; name the part of the step
// that grew most.
std::string LossReason(const PlanEstimate& best, const PlanEstimate& alt) {
  const std::pair<const char*, double> parts[] = {
      {"compute", alt.compute_s - best.compute_s},
      {"tensor-parallel communication", alt.tp_exposed_s - best.tp_exposed_s},
      {"pipeline communication", alt.pp_exposed_s - best.pp_exposed_s},
      {"data-parallel communication", alt.dp_exposed_s - best.dp_exposed_s},
      {"pipeline bubble", alt.bubble_s - best.bubble_s},
      {"optimizer step", alt.optimizer_s - best.optimizer_s}};
  const auto* worst =
      std::max_element(std::begin(parts), std::end(parts),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  return fmt::format("{:+.1f}% step time, mostly {} ({:+.1f} ms)",
                     100 * (alt.step_time_s / best.step_time_s - 1), worst->first,
                     worst->second * 1e3);
}

bool Better(const RankedPlan& a, const RankedPlan& b) {
  if (a.estimate.step_time_s != b.estimate.step_time_s) {
    return a.estimate.step_time_s < b.estimate.step_time_s;
  }
  // A tie (with more devices than cores every bubble is absorbed alike): the schedule that
  // idles least, as a shared core takes back only part of a waiting stage's time (ZB-H1
  // measured 6-11% ahead of 1F1B on 3 ranks of 2 cores, bench/plan/README.md); then the
  // leaner plan.
  if (a.estimate.bubble_fraction != b.estimate.bubble_fraction) {
    return a.estimate.bubble_fraction < b.estimate.bubble_fraction;
  }
  return a.estimate.memory.total < b.estimate.memory.total;
}

}  // namespace

Result<SearchResult> SearchPlans(const ModelSpec& spec, const ClusterSpec& cluster,
                                 int64_t global_batch, const SearchConstraints& constraints,
                                 const CostModelOptions& options, int keep) {
  const int n = cluster.devices;
  if (n < 1 || global_batch < 1) {
    return InvalidArgumentError(fmt::format(
        "planner: {} devices and a global batch of {}: both must be positive", n, global_batch));
  }
  if (constraints.memory_headroom < 0 || constraints.memory_headroom >= 1) {
    return InvalidArgumentError("planner: memory headroom must be in [0, 1)");
  }
  if (const int t = constraints.fixed_t; t > 0) {
    std::string why;
    if (n % t != 0) {
      why = fmt::format("it does not divide the {} devices", n);
    } else if (t > cluster.devices_per_node || cluster.devices_per_node % t != 0) {
      why = fmt::format(
          "tensor-parallel groups stay inside a node and t must divide its {} "
          "devices",
          cluster.devices_per_node);
    } else if (spec.heads % t != 0 || spec.ffn_hidden % t != 0) {
      why = fmt::format("it must divide the heads ({}) and ffn_hidden ({})", spec.heads,
                        spec.ffn_hidden);
    }
    if (!why.empty()) {
      std::vector<int64_t> work;
      for (int64_t c : Divisors(cluster.devices_per_node)) {
        if (n % c == 0 && spec.heads % c == 0 && spec.ffn_hidden % c == 0) work.push_back(c);
      }
      return InvalidArgumentError(fmt::format("planner: fixed t={}: {}; t in {{{}}} would do", t,
                                              why, fmt::join(work, ", ")));
    }
  }
  SearchResult result;
  std::vector<RankedPlan> fitting;
  RankedPlan leanest;  // the plan needing the least memory, fitting or not
  std::optional<RankedPlan> fastest_unfit;
  bool any = false;
  for (int64_t t : Divisors(n)) {
    if (t > cluster.devices_per_node) break;          // keep tensor parallelism inside a node,
    if (cluster.devices_per_node % t != 0) continue;  // every group wholly in one
    if (constraints.fixed_t > 0 && t != constraints.fixed_t) continue;
    if (spec.heads % t != 0 || spec.ffn_hidden % t != 0) continue;
    for (int64_t p : Divisors(n / t)) {
      if (p > spec.layers) break;
      if (constraints.max_p > 0 && p > constraints.max_p) break;
      const int64_t d = n / t / p;
      if (global_batch % d != 0) continue;
      const int64_t per_replica = global_batch / d;
      for (int64_t mbs : Divisors(per_replica)) {
        if (mbs > constraints.max_micro_batch_size) break;
        const int64_t m = per_replica / mbs;
        // Schedules: none to choose without a pipeline.
        std::vector<std::pair<Schedule, int>> schedules = {{Schedule::k1F1B, 1}};
        if (p > 1) {
          schedules.push_back({Schedule::kZeroBubbleH1, 1});
          schedules.push_back({Schedule::kGpipe, 1});
          if (spec.layers % p == 0) {
            for (int64_t v : Divisors(spec.layers / p)) {
              if (v >= 2 && v <= 8)
                schedules.push_back({Schedule::kInterleaved, static_cast<int>(v)});
            }
          }
        }
        for (const auto& [schedule, v] : schedules) {
          for (bool recompute : {false, true}) {
            if (recompute && !constraints.allow_recompute) continue;
            for (int zero = 0; zero <= std::min(constraints.max_zero_stage, d > 1 ? 3 : 0);
                 ++zero) {
              ParallelPlan plan;
              plan.t = static_cast<int>(t);
              plan.p = static_cast<int>(p);
              plan.d = static_cast<int>(d);
              plan.micro_batch_size = mbs;
              plan.micro_batches = m;
              plan.schedule = schedule;
              plan.v = v;
              plan.recompute = recompute;
              plan.zero_stage = zero;
              if (!ValidatePlan(plan, spec, n, global_batch).ok()) continue;
              if (!EngineSupports(plan, cluster.device).ok()) continue;
              Result<PlanEstimate> e = EstimatePlan(spec, plan, cluster, global_batch, options);
              if (!e.ok()) continue;
              ++result.evaluated;
              RankedPlan r{plan, *e, ""};
              if (!any || r.estimate.memory.total < leanest.estimate.memory.total) leanest = r;
              any = true;
              if (e->memory.total > e->memory.capacity * (1 - constraints.memory_headroom)) {
                if (!fastest_unfit || Better(r, *fastest_unfit)) fastest_unfit = r;
                continue;
              }
              ++result.fitting;
              fitting.push_back(std::move(r));
            }
          }
        }
      }
    }
  }
  if (!any) {
    return InvalidArgumentError(fmt::format(
        "planner: no plan splits a global batch of {} over {} devices for model {} (the data-"
        "parallel degree must divide the batch, t the heads and ffn_hidden, p the layers)",
        global_batch, n, spec.name));
  }
  if (fitting.empty()) {
    const MemoryEstimate& m = leanest.estimate.memory;
    const double need =
        m.total / options.usable_memory_fraction / (1 - constraints.memory_headroom);
    const int more = static_cast<int>(std::ceil(static_cast<double>(n) * m.total /
                                                (m.capacity * (1 - constraints.memory_headroom))));
    return ResourceExhaustedError(fmt::format(
        "planner: model {} does not fit on {} devices of {:.1f} GB: its leanest plan ({}) needs "
        "{:.1f} GB per device; devices of {:.0f} GB, or about {} devices, would do",
        spec.name, n, cluster.memory_bytes / 1e9, PlanToString(leanest.plan), m.total / 1e9,
        std::ceil(need / 1e9), more));
  }
  std::sort(fitting.begin(), fitting.end(), Better);
  if (static_cast<int>(fitting.size()) > keep) fitting.resize(static_cast<size_t>(keep));
  for (size_t i = 1; i < fitting.size(); ++i) {
    fitting[i].reason = LossReason(fitting[0].estimate, fitting[i].estimate);
  }
  if (fastest_unfit && Better(*fastest_unfit, fitting[0])) {
    const PlanEstimate& e = fastest_unfit->estimate;
    fastest_unfit->reason = fmt::format(
        "memory: {:.1f}% faster, but needs {:.2f} GB per device of {:.2f} GB usable{}",
        100 * (fitting[0].estimate.step_time_s / e.step_time_s - 1), e.memory.total / 1e9,
        e.memory.capacity * (1 - constraints.memory_headroom) / 1e9,
        constraints.memory_headroom > 0 ? " (after the headroom)" : "");
    result.fastest_unfit = std::move(fastest_unfit);
  }
  result.ranked = std::move(fitting);
  return result;
}

Result<RankedPlan> BaselinePlan(const ModelSpec& spec, const ClusterSpec& cluster,
                                int64_t global_batch, const CostModelOptions& options) {
  const int n = cluster.devices;
  const double layer_bytes = 16.0 *
                             static_cast<double>(ParameterCount(spec) - spec.vocab * spec.hidden) /
                             static_cast<double>(spec.layers);
  const double model_bytes = 16.0 * static_cast<double>(ParameterCount(spec));
  const double limit = 0.6 * cluster.memory_bytes;
  for (int64_t t : Divisors(n)) {
    if (spec.heads % t != 0 || spec.ffn_hidden % t != 0 || t > cluster.devices_per_node ||
        cluster.devices_per_node % t != 0) {
      continue;
    }
    if (layer_bytes / static_cast<double>(t) > limit) continue;  // rule 1: tensor parallel first
    for (int64_t p : Divisors(n / t)) {
      if (p > spec.layers) break;
      // Rule 2: pipeline until the training state fits the tensor-parallel group.
      if (model_bytes / static_cast<double>(t * p) > limit) continue;
      const int64_t d = n / t / p;  // rule 3: data parallel with the rest
      if (global_batch % d != 0) continue;
      ParallelPlan plan;
      plan.t = static_cast<int>(t);
      plan.p = static_cast<int>(p);
      plan.d = static_cast<int>(d);
      plan.micro_batch_size = 1;
      plan.micro_batches = global_batch / d;
      for (bool recompute : {false, true}) {
        plan.recompute = recompute;
        if (!ValidatePlan(plan, spec, n, global_batch).ok()) break;
        KC_ASSIGN_OR_RETURN(PlanEstimate e,
                            EstimatePlan(spec, plan, cluster, global_batch, options));
        if (e.memory.fits) return RankedPlan{plan, e, "the seed's rules"};
      }
    }
  }
  return ResourceExhaustedError("planner: the seed's rules find no plan of model " + spec.name +
                                " that splits a global batch of " + std::to_string(global_batch) +
                                " and fits on " + std::to_string(n) + " devices");
}

}  // namespace kc::parallel::planner
