// Plans priced on the devices they run on. docs/design/planner-cost-model.md, "Mixed
// clusters".
#include "parallel/planner/hetero.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "parallel/pipeline_schedule.h"

namespace kc::parallel::planner {
namespace {

// The slowest link and the largest latency between consecutive members of a ring.
struct RingLink {
  double bandwidth = 0;  // 0: fewer than two members
  double latency = 0;
};

RingLink RingOver(const hal::Topology& topology, const std::vector<int>& members) {
  RingLink r;
  if (members.size() < 2) return r;
  r.bandwidth = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < members.size(); ++i) {
    const hal::PathCost p = topology.Path(members[i], members[(i + 1) % members.size()]);
    r.bandwidth = std::min(r.bandwidth, p.bandwidth);
    r.latency = std::max(r.latency, p.latency);
  }
  return r;
}

// The worse of two links (an unset one, bandwidth 0, counts as none).
RingLink Worse(RingLink a, RingLink b) {
  if (a.bandwidth == 0) return b;
  if (b.bandwidth == 0) return a;
  return {std::min(a.bandwidth, b.bandwidth), std::max(a.latency, b.latency)};
}

// What one stage's devices are: the weakest figure of its block.
struct StageDevices {
  double peak = std::numeric_limits<double>::infinity();
  double memory = std::numeric_limits<double>::infinity();
  double memory_bandwidth = std::numeric_limits<double>::infinity();
  std::string model;
  RingLink tp, dp, next;  // next: to the following stage
};

// Layers per stage sized to the stages: stage s costs unit[s] per u layers and extra[s] on
// top; the contiguous split into multiples of u that minimises the slowest stage.
std::vector<int> SizeStages(const std::vector<double>& unit, const std::vector<double>& extra,
                            int layers, int u) {
  const size_t p = unit.size();
  const int units = layers / u;
  auto caps = [&](double tau) {
    std::vector<int> k(p);
    for (size_t s = 0; s < p; ++s) {
      const double c = std::floor((tau - extra[s]) / unit[s]);
      k[s] = static_cast<int>(std::clamp(c, 0.0, static_cast<double>(units)));
    }
    return k;
  };
  auto feasible = [&](const std::vector<int>& k) {
    int sum = 0;
    for (int x : k) {
      if (x < 1) return false;
      sum += x;
    }
    return sum >= units;
  };
  double lo = 0, hi = 0;
  for (size_t s = 0; s < p; ++s) hi = std::max(hi, unit[s] * units + extra[s]);
  hi = hi * (1 + 1e-9) + 1e-300;  // every stage can take every layer: feasible
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (feasible(caps(mid)) ? hi : lo) = mid;
  }
  std::vector<int> k = caps(hi);
  int sum = std::accumulate(k.begin(), k.end(), 0);
  while (sum > units) {  // give back from the stage that is slowest with its last unit
    size_t worst = p;
    for (size_t s = 0; s < p; ++s) {
      if (k[s] <= 1) continue;
      if (worst == p || unit[s] * k[s] + extra[s] > unit[worst] * k[worst] + extra[worst]) {
        worst = s;
      }
    }
    --k[worst];
    --sum;
  }
  for (int& x : k) x *= u;
  return k;
}

}  // namespace

Result<DeviceEstimate> EstimateOnDevices(const ModelSpec& spec, const ParallelPlan& plan,
                                         const hal::Topology& topology, int64_t global_batch,
                                         const CostModelOptions& o,
                                         std::span<const int> layers_per_stage) {
  const int n = topology.num_devices();
  KC_RETURN_IF_ERROR(ValidatePlan(plan, spec, n, global_batch));
  const int t = plan.t, p = plan.p, d = plan.d;
  const int block = t * d;
  bool fp32 = false;
  for (int i = 0; i < n; ++i) fp32 = fp32 || !(topology.device(i).peak_flops_bf16 > 0);

  // Each stage's devices and the links its groups use.
  std::vector<StageDevices> stages(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    StageDevices& st = stages[static_cast<size_t>(s)];
    const int base = s * block;
    for (int i = base; i < base + block; ++i) {
      const hal::DeviceDescriptor& dev = topology.device(i);
      st.peak = std::min(st.peak, fp32 ? dev.peak_flops_fp32 : dev.peak_flops_bf16);
      st.memory = std::min(st.memory, static_cast<double>(dev.memory_bytes));
      st.memory_bandwidth = std::min(st.memory_bandwidth, dev.memory_bandwidth);
      if (st.model.empty()) st.model = dev.model;
      if (st.model != dev.model) st.model = "mixed";
    }
    for (int r = 0; r < d; ++r) {
      std::vector<int> group(static_cast<size_t>(t));
      std::iota(group.begin(), group.end(), base + r * t);
      st.tp = Worse(st.tp, RingOver(topology, group));
    }
    for (int k = 0; k < t; ++k) {
      std::vector<int> ring;
      for (int j = 0; j < d; ++j) ring.push_back(base + k + j * t);
      st.dp = Worse(st.dp, RingOver(topology, ring));
    }
    if (s + 1 < p) {
      st.next.bandwidth = std::numeric_limits<double>::infinity();
      for (int i = 0; i < block; ++i) {
        const hal::PathCost path = topology.Path(base + i, base + block + i);
        st.next.bandwidth = std::min(st.next.bandwidth, path.bandwidth);
        st.next.latency = std::max(st.next.latency, path.latency);
      }
    }
    if (!(st.peak > 0) || !(st.memory > 0)) {
      return InvalidArgumentError(fmt::format(
          "planner: stage {} of {} has a device without a peak or memory", s, PlanToString(plan)));
    }
  }

  // One micro-batch through one layer (Korthikanti et al. 2022 eq. 7 per layer; the head's
  // 6bshV not recomputed), split over t, and its tensor-parallel all-reduces.
  const double b = static_cast<double>(plan.micro_batch_size);
  const double sl = static_cast<double>(spec.seq_len);
  const double h = static_cast<double>(spec.hidden);
  const double f = static_cast<double>(spec.ffn_hidden);
  const double m = static_cast<double>(plan.micro_batches);
  double layer_flops =
      (plan.recompute ? 96 : 72) * b * sl * h * h * ((4 * h + 2 * f) / (12 * h) + sl / (6 * h));
  if (o.selective_recompute && !plan.recompute) layer_flops += 72 * b * sl * h * h * sl / (6 * h);
  const double head_flops = 6 * b * sl * h * static_cast<double>(spec.vocab);
  const double eff = MatmulEfficiency(o, b * sl * h / t, h);
  const double tp_message = b * sl * h * o.activation_bytes;
  const int tp_collectives = 4 + (plan.recompute ? 2 : 0);
  std::vector<double> unit(static_cast<size_t>(p)), extra(static_cast<size_t>(p), 0.0);
  for (int s = 0; s < p; ++s) {
    const StageDevices& st = stages[static_cast<size_t>(s)];
    unit[static_cast<size_t>(s)] =
        layer_flops / t / (st.peak * eff) +
        (t > 1
             ? tp_collectives * RingAllReduceSeconds(t, tp_message, st.tp.bandwidth, st.tp.latency)
             : 0);
  }
  extra.back() = head_flops / t / (stages.back().peak * eff);

  // The layers: given, or sized to the stages in whole chunks.
  std::vector<int> layers(layers_per_stage.begin(), layers_per_stage.end());
  if (layers.empty()) {
    const int u = plan.v;
    std::vector<double> per_unit(unit);
    for (double& x : per_unit) x *= u;
    layers = SizeStages(per_unit, extra, static_cast<int>(spec.layers), u);
  }
  if (static_cast<int>(layers.size()) != p ||
      std::accumulate(layers.begin(), layers.end(), 0) != spec.layers ||
      *std::min_element(layers.begin(), layers.end()) < 1) {
    return InvalidArgumentError(fmt::format(
        "planner: {} layers per stage for {} stages of {} layers: each positive, adding up",
        layers.size(), p, spec.layers));
  }

  DeviceEstimate e;
  const double block_params =
      static_cast<double>(NonEmbeddingParameterCount(spec)) / static_cast<double>(spec.layers);
  const double embedding = static_cast<double>(spec.vocab) * h;
  const LayerActivations acts = ActivationBytesPerLayer(spec, plan, o);
  const bool split_sends = o.pipeline_scatter_gather || o.sequence_parallel;
  const double pp_message = tp_message / (split_sends ? t : 1);
  double slowest = 0, total = 0, send = 0, dp = 0, optimizer = 0;
  e.fits = true;
  for (int s = 0; s < p; ++s) {
    const StageDevices& st = stages[static_cast<size_t>(s)];
    StageEstimate se;
    se.layers = layers[static_cast<size_t>(s)];
    se.device_model = st.model;
    se.micro_batch_s = unit[static_cast<size_t>(s)] * se.layers + extra[static_cast<size_t>(s)];
    se.tp_link_bandwidth = st.tp.bandwidth;
    se.dp_link_bandwidth = st.dp.bandwidth;
    slowest = std::max(slowest, se.micro_batch_s);
    total += se.micro_batch_s;
    if (s + 1 < p) send = std::max(send, pp_message / st.next.bandwidth + st.next.latency);

    // Its gradients over its data-parallel rings, hidden behind its last backward as far as
    // the engine's overlap goes; its optimizer step over its shard.
    double params = block_params * se.layers;
    if (s == 0) params += embedding + sl * h;                                 // wte, wpe
    if (s == p - 1 && (p > 1 || !spec.tied_embeddings)) params += embedding;  // the head
    params /= t;
    if (d > 1) {
      const double time =
          RingAllReduceSeconds(d, params * o.gradient_bytes, st.dp.bandwidth, st.dp.latency);
      const double last_backward = se.micro_batch_s * (plan.recompute ? 3.0 / 4 : 2.0 / 3);
      se.dp_exposed_s = time - std::min(o.dp_overlap_fraction * time, last_backward);
    }
    if (st.memory_bandwidth > 0) {
      se.optimizer_s =
          params / (plan.zero_stage >= 1 ? d : 1) * o.optimizer_step_bytes / st.memory_bandwidth;
    }
    dp = std::max(dp, se.dp_exposed_s);
    optimizer = std::max(optimizer, se.optimizer_s);

    // Memory: the training state of its layers, the activations it holds at its peak.
    double in_flight = MicroBatchesInFlight(plan);
    if (plan.schedule == Schedule::k1F1B || plan.schedule == Schedule::kZeroBubbleH1) {
      in_flight = std::min<double>(p - s, m);
    }
    se.memory_bytes = params * (o.param_bytes / (plan.zero_stage >= 3 ? d : 1) +
                                o.gradient_bytes / (plan.zero_stage >= 2 ? d : 1) +
                                o.optimizer_bytes / (plan.zero_stage >= 1 ? d : 1)) +
                      acts.kept * se.layers * in_flight + (plan.recompute ? acts.full : 0) +
                      (s == p - 1 ? 4 * sl * b * static_cast<double>(spec.vocab) / t : 0);
    se.capacity = st.memory * o.usable_memory_fraction;
    e.fits = e.fits && se.memory_bytes <= se.capacity;
    e.stages.push_back(std::move(se));
  }
  // m micro-batches at the slowest stage's pace, the fill and drain through the others (the
  // schedule's share of it), and every send between stages, blocking.
  const double fill = p > 1 ? BubbleFraction(plan) * m / (p - 1) : 0;
  e.pipeline_s = m * slowest + fill * (total - slowest) + (p > 1 ? 2 * plan.v * m * send : 0);
  e.step_time_s = e.pipeline_s + dp + optimizer;
  e.tokens_per_s = static_cast<double>(global_batch) * sl / e.step_time_s;
  return e;
}

Result<DeviceSearchResult> SearchOnDevices(const ModelSpec& spec, const hal::Topology& topology,
                                           const ClusterSpec& cluster, int64_t global_batch,
                                           const SearchConstraints& constraints,
                                           const CostModelOptions& options) {
  KC_ASSIGN_OR_RETURN(SearchResult all, SearchPlans(spec, cluster, global_batch, constraints,
                                                    options, std::numeric_limits<int>::max()));
  // The engine's split: each stage's blocks of BalanceStages' p * v chunks.
  auto balanced = [&](const ParallelPlan& plan) -> Result<DeviceEstimate> {
    KC_ASSIGN_OR_RETURN(std::vector<int> bounds, BalanceStages(spec, plan.p * plan.v));
    std::vector<int> layers(static_cast<size_t>(plan.p), 0);
    for (size_t c = 0; c + 1 < bounds.size(); ++c) layers[c % plan.p] += bounds[c + 1] - bounds[c];
    return EstimateOnDevices(spec, plan, topology, global_batch, options, layers);
  };
  DeviceSearchResult out;
  bool found = false;
  for (const RankedPlan& r : all.ranked) {
    KC_ASSIGN_OR_RETURN(DeviceEstimate sized,
                        EstimateOnDevices(spec, r.plan, topology, global_batch, options));
    ++out.evaluated;
    if (!sized.fits || (found && sized.step_time_s >= out.best.sized.step_time_s)) continue;
    found = true;
    out.best.plan = r.plan;
    out.best.sized = std::move(sized);
  }
  if (!found) {
    return ResourceExhaustedError(
        fmt::format("planner: no plan of model {} fits on every stage's devices", spec.name));
  }
  KC_ASSIGN_OR_RETURN(out.best.balanced, balanced(out.best.plan));
  out.homogeneous.plan = all.ranked.front().plan;
  KC_ASSIGN_OR_RETURN(out.homogeneous.sized, EstimateOnDevices(spec, out.homogeneous.plan, topology,
                                                               global_batch, options));
  KC_ASSIGN_OR_RETURN(out.homogeneous.balanced, balanced(out.homogeneous.plan));
  return out;
}

}  // namespace kc::parallel::planner
