// The planner's cost model. Formulas and sources: docs/design/planner-cost-model.md.
#include "parallel/planner/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "parallel/pipeline_schedule.h"

namespace kc::parallel::planner {
namespace {

// A group is inside a node when the ranks it spans fit in one. Ranks are laid out as Megatron
// lays them out: t fastest, then d, then p; so a tp group spans t consecutive ranks, a dp
// group t*d (stride t) and a pp group the whole t*d*p (stride t*d).
Link GroupLink(int size, int64_t span, int devices_per_node) {
  if (size <= 1) return Link::kNone;
  return span <= devices_per_node ? Link::kIntraNode : Link::kInterNode;
}

double Bandwidth(Link link, const ClusterSpec& c) {
  return link == Link::kInterNode ? c.inter_node_bandwidth : c.intra_node_bandwidth;
}

double Latency(Link link, const ClusterSpec& c) {
  return link == Link::kInterNode ? c.inter_node_latency : c.intra_node_latency;
}

Status CheckInputs(const ModelSpec& spec, const ClusterSpec& c, const CostModelOptions& o) {
  if (spec.layers <= 0 || spec.hidden <= 0 || spec.heads <= 0 || spec.ffn_hidden <= 0 ||
      spec.vocab <= 0 || spec.seq_len <= 0) {
    return InvalidArgumentError(fmt::format(
        "cost model: model {}: layers, hidden, heads, ffn_hidden, vocab and seq_len must be "
        "positive",
        spec.name));
  }
  if (c.devices <= 0 || c.devices_per_node <= 0 || c.peak_flops <= 0 || c.memory_bytes <= 0 ||
      c.intra_node_bandwidth <= 0 || c.inter_node_bandwidth <= 0 || c.memory_bandwidth < 0 ||
      c.intra_node_latency < 0 || c.inter_node_latency < 0 || !(c.oversubscription >= 1)) {
    return InvalidArgumentError(
        "cost model: cluster: devices, devices_per_node, peak_flops, memory_bytes and the "
        "bandwidths must be positive, latencies and memory_bandwidth not negative, "
        "oversubscription at least 1");
  }
  if (o.matmul_efficiency <= 0 || o.matmul_efficiency > 1 || o.efficiency_half_size < 0 ||
      !(o.efficiency_half_hidden >= 0) || !(o.efficiency_min_hidden >= 0) ||
      o.dp_overlap_fraction < 0 || o.dp_overlap_fraction > 1 || o.usable_memory_fraction <= 0 ||
      o.usable_memory_fraction > 1 || !(o.shared_core_bubble_kept >= 0) ||
      o.shared_core_bubble_kept > 1) {
    return InvalidArgumentError(
        "cost model: options: matmul_efficiency and usable_memory_fraction must be in (0, 1], "
        "dp_overlap_fraction and shared_core_bubble_kept in [0, 1], efficiency_half_size, "
        "efficiency_half_hidden and efficiency_min_hidden not negative");
  }
  for (size_t i = 0; i < o.efficiency_points.size(); ++i) {
    const auto [size, eff] = o.efficiency_points[i];
    if (!(size > 0) || !(eff > 0) || (i > 0 && !(size > o.efficiency_points[i - 1].first))) {
      return InvalidArgumentError(
          "cost model: options: efficiency_points must have positive sizes and efficiencies, "
          "sizes increasing");
    }
  }
  return OkStatus();
}

}  // namespace

// Narayanan et al. 2021 Sec. 2.2; Korthikanti et al. 2022 Sec. 4.2.3 for the interleaved
// factor; ZB-H1 has 1F1B's peak, Qi et al. 2023 Sec. 3.
double MicroBatchesInFlight(const ParallelPlan& plan) {
  const double p = plan.p;
  const double m = static_cast<double>(plan.micro_batches);
  switch (plan.schedule) {
    case Schedule::kGpipe:
      return m;
    case Schedule::k1F1B:
    case Schedule::kZeroBubbleH1:
      return std::min(p, m);
    case Schedule::kInterleaved:
      return p * (1 + (p - 1) / (p * plan.v));
  }
  return m;
}

LayerActivations ActivationBytesPerLayer(const ModelSpec& spec, const ParallelPlan& plan,
                                         const CostModelOptions& o) {
  // Korthikanti et al. 2022 Sec. 4: one layer of one micro-batch keeps s*b*h*(34 + 5as/h)
  // bytes at 16 bits, (10 + 24/t + 5as/(ht))*sbh with tensor parallelism alone, all of it over
  // t with sequence parallelism. Full recompute keeps only the layer input, 2*sbh (over t with
  // sequence parallelism), and needs one whole layer back while it recomputes it.
  const double t = plan.t;
  const double s = static_cast<double>(spec.seq_len);
  const double h = static_cast<double>(spec.hidden);
  const double a = static_cast<double>(spec.heads);
  const double sbh = s * static_cast<double>(plan.micro_batch_size) * h;
  const double scale = o.activation_bytes / 2;
  // Selective recompute keeps all but the attention core's 5as/h.
  const double attention = o.selective_recompute && !plan.recompute ? 0 : 5 * a * s / h;
  LayerActivations out;
  out.full = scale * (o.sequence_parallel ? sbh * (34 + attention) / t
                                          : sbh * (10 + 24 / t + attention / t));
  out.kept = plan.recompute ? scale * 2 * sbh / (o.sequence_parallel ? t : 1) : out.full;
  return out;
}

namespace {

MemoryEstimate EstimateMemory(const ModelSpec& spec, const ParallelPlan& plan,
                              const ClusterSpec& cluster, const CostModelOptions& o,
                              double stage_tp_bytes, double stage_pp_bytes, double dp_bytes) {
  const double t = plan.t;
  const double d = plan.d;
  const double params = static_cast<double>(ParameterCount(spec)) / (t * plan.p);
  MemoryEstimate m;
  // ZeRO (Rajbhandari et al. 2020): stage 1 shards the optimizer state over d, 2 also the
  // gradients, 3 also the weights.
  m.optimizer_state = params * o.optimizer_bytes / (plan.zero_stage >= 1 ? d : 1);
  m.gradients = params * o.gradient_bytes / (plan.zero_stage >= 2 ? d : 1);
  m.weights = params * o.param_bytes / (plan.zero_stage >= 3 ? d : 1);

  const double s = static_cast<double>(spec.seq_len);
  const LayerActivations layer = ActivationBytesPerLayer(spec, plan, o);
  const double layers_per_stage = static_cast<double>(spec.layers) / plan.p;
  // The loss reads fp32 logits, b*s*V/t of them on the last stage (vocab-parallel). Counted
  // with the first stage's activations: an overestimate by that much when p > 1.
  const double logits =
      4 * s * static_cast<double>(plan.micro_batch_size) * static_cast<double>(spec.vocab) / t;
  m.activations = layer.kept * layers_per_stage * MicroBatchesInFlight(plan) +
                  (plan.recompute ? layer.full : 0) + logits;

  // One tensor-parallel all-reduce buffer, a send and a receive buffer each way between
  // stages, and two gradient buckets in flight.
  m.communication_buffers = (plan.t > 1 ? stage_tp_bytes : 0) +
                            (plan.p > 1 ? 4 * stage_pp_bytes : 0) +
                            (plan.d > 1 ? 2 * std::min(o.dp_bucket_bytes, dp_bytes) : 0);
  m.total = m.weights + m.gradients + m.optimizer_state + m.activations + m.communication_buffers;
  m.capacity = cluster.memory_bytes * o.usable_memory_fraction;
  m.fits = m.total <= m.capacity;
  return m;
}

const MeasuredPass* FindPass(const CostModelOptions& o, int t, int64_t b) {
  for (const MeasuredPass& p : o.measured_passes) {
    if (p.t == t && p.micro_batch_size == b && p.seconds > 0) return &p;
  }
  return nullptr;
}

// One tensor-parallel all-reduce of micro-batch size b among devices that compute beside it,
// as measured: what communicating added to each pass of group size t, per all-reduce of the
// pass, on a least-squares line over the micro-batch sizes measured (the message grows with
// b; each size's figure is a difference of two medians, noisy alone). 0: none measured.
double MeasuredTpCollective(const ModelSpec& spec, const CostModelOptions& o, int t, int64_t b) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const MeasuredPass& p : o.measured_passes) {
    if (p.t != t || !(p.tp_comm_seconds > 0) || !(p.seconds > 0)) continue;
    const double x = static_cast<double>(p.micro_batch_size);
    const double y = std::max(0.0, p.tp_comm_seconds - p.seconds) / TensorParallelCollectives(spec);
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  if (n == 0) return 0;
  const double var = n * sxx - sx * sx;
  if (!(var > 0)) return sy / n;  // one size measured
  const double slope = (n * sxy - sx * sy) / var;
  const double intercept = (sy - slope * sx) / n;
  return std::max(0.0, intercept + slope * static_cast<double>(b));
}

// One micro-batch's forward + backward on the slowest stage of `plan`, from a measured pass:
// the stages' chunks as the trainer cuts them (BalanceStages over p * v chunks, stage s
// holding chunks s, s + p, ...), each block at the measured block's time, and the rest of the
// whole model's time (the head, the loss, the embeddings) on the stage with the last layer.
double SlowestStageSeconds(const ModelSpec& spec, const ParallelPlan& plan,
                           const MeasuredPass& pass) {
  const double layers = static_cast<double>(spec.layers);
  double block = pass.block_seconds;
  // A block timed slower than its share of the whole pass (the short probe, on cores the
  // devices share, can be timed under other sharing than the long one): by the shares.
  if (!(block > 0) || layers * block > pass.seconds) {
    const std::vector<double> costs = LayerCosts(spec);
    double total = 0;
    for (double c : costs) total += c;
    block = pass.seconds * costs.front() / total;
  }
  const double rest = std::max(0.0, pass.seconds - layers * block);
  if (plan.p == 1) return layers * block + rest;
  Result<std::vector<int>> bounds = BalanceStages(spec, plan.p * plan.v);
  if (!bounds.ok()) return (layers * block + rest) / plan.p;  // ValidatePlan let it through
  double slowest = 0;
  for (int s = 0; s < plan.p; ++s) {
    double stage = 0;
    for (int c = 0; c < plan.v; ++c) {
      const size_t chunk = static_cast<size_t>(c * plan.p + s);
      stage += block * ((*bounds)[chunk + 1] - (*bounds)[chunk]);
      if ((*bounds)[chunk + 1] == spec.layers) stage += rest;
    }
    slowest = std::max(slowest, stage);
  }
  return slowest;
}

}  // namespace

std::string_view LinkName(Link link) {
  switch (link) {
    case Link::kNone:
      return "none";
    case Link::kIntraNode:
      return "intra-node";
    case Link::kInterNode:
      return "inter-node";
  }
  return "unknown";
}

double StepFlops(const ModelSpec& spec, int64_t global_batch, bool recompute) {
  const double b = static_cast<double>(global_batch);
  const double s = static_cast<double>(spec.seq_len);
  const double l = static_cast<double>(spec.layers);
  const double h = static_cast<double>(spec.hidden);
  const double f = static_cast<double>(spec.ffn_hidden);
  const double v = static_cast<double>(spec.vocab);
  // The logits are not recomputed, so their term keeps 6*B*s*h*V either way.
  const double k = recompute ? 96 : 72;
  const double logits = recompute ? v / (16 * l * h) : v / (12 * l * h);
  return k * b * s * l * h * h * ((4 * h + 2 * f) / (12 * h) + s / (6 * h) + logits);
}

double TensorParallelCollectives(const ModelSpec& spec) {
  return 4.0 * static_cast<double>(spec.layers) + 4;
}

double RingAllReduceSeconds(int n, double bytes, double bandwidth, double latency) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / bandwidth + 2.0 * (n - 1) * latency;
}

double BubbleFraction(const ParallelPlan& plan) {
  const double idle = static_cast<double>(plan.p - 1) / static_cast<double>(plan.micro_batches);
  switch (plan.schedule) {
    case Schedule::kGpipe:
    case Schedule::k1F1B:
      return idle;
    case Schedule::kInterleaved:
      return idle / plan.v;
    case Schedule::kZeroBubbleH1:
      // Qi et al. 2023 Sec. 2: ZB-H1 idles (p-1)(T_F + T_B - T_W) against 1F1B's
      // (p-1)(T_F + T_B + T_W); with the three passes equal, a third.
      return idle / 3;
  }
  return idle;
}

double MatmulEfficiency(const CostModelOptions& o, double size, double hidden) {
  auto curve = [&](double x) { return o.matmul_efficiency * x / (x + o.efficiency_half_size); };
  const auto& pts = o.efficiency_points;
  if (pts.empty()) {
    // Points measured on the model planned have its width in them already.
    const double w = std::max(hidden, o.efficiency_min_hidden);
    const double width = o.efficiency_half_hidden > 0 ? w / (w + o.efficiency_half_hidden) : 1.0;
    return width * curve(size);
  }
  if (size <= pts.front().first) return curve(size) * pts.front().second / curve(pts.front().first);
  if (size >= pts.back().first) return curve(size) * pts.back().second / curve(pts.back().first);
  size_t i = 1;
  while (pts[i].first < size) ++i;
  const auto [x0, y0] = pts[i - 1];
  const auto [x1, y1] = pts[i];
  const double f = std::log(size / x0) / std::log(x1 / x0);
  return y0 + f * (y1 - y0);
}

Result<PlanEstimate> EstimatePlan(const ModelSpec& spec, const ParallelPlan& plan,
                                  const ClusterSpec& cluster, int64_t global_batch,
                                  const CostModelOptions& options) {
  KC_RETURN_IF_ERROR(CheckInputs(spec, cluster, options));
  KC_RETURN_IF_ERROR(ValidatePlan(plan, spec, cluster.devices, global_batch));
  const CostModelOptions& o = options;
  const double t = plan.t;
  const double m = static_cast<double>(plan.micro_batches);
  const double layers_per_device = static_cast<double>(spec.layers) / plan.p;
  const double sbh = static_cast<double>(spec.seq_len) *
                     static_cast<double>(plan.micro_batch_size) * static_cast<double>(spec.hidden);

  PlanEstimate e;
  e.flops_per_step = StepFlops(spec, global_batch, plan.recompute);
  e.hardware_flops_per_step = e.flops_per_step;
  if (o.selective_recompute && !plan.recompute) {
    // Korthikanti et al. 2022 eq. 8: the attention term s/(6h) becomes s/(3h).
    const double s = static_cast<double>(spec.seq_len);
    const double h = static_cast<double>(spec.hidden);
    e.hardware_flops_per_step += 72.0 * static_cast<double>(global_batch) * s *
                                 static_cast<double>(spec.layers) * h * h * s / (6 * h);
  }
  // Matmuls lose efficiency as they shrink (launch and tile-quantisation overheads); a
  // saturating curve in the per-device activation size, one curve for every case.
  const double size = sbh / t;
  const MeasuredPass* pass = FindPass(o, plan.t, plan.micro_batch_size);
  if (pass != nullptr) {
    // Timed on this machine: the slowest stage's micro-batches, with the recomputed forward.
    const double forward = pass->forward_share > 0 ? pass->forward_share : 1.0 / 3;
    e.compute_s = m * SlowestStageSeconds(spec, plan, *pass) * (plan.recompute ? 1 + forward : 1.0);
    e.matmul_efficiency =
        e.hardware_flops_per_step / cluster.devices / (cluster.peak_flops * e.compute_s);
  } else {
    e.matmul_efficiency = MatmulEfficiency(o, size, static_cast<double>(spec.hidden));
    e.compute_s =
        e.hardware_flops_per_step / cluster.devices / (cluster.peak_flops * e.matmul_efficiency);
  }

  // Tensor parallelism (Shoeybi et al. 2019): two all-reduces of b*s*h forward and two
  // backward per layer, two more when the forward is recomputed; on the critical path. The
  // vocabulary-parallel embeddings and head add, per micro-batch, one of b*s*h each way (the
  // embeddings' output, the head's input gradient) and two of per-token fp32 statistics for
  // the loss (b*s maxima, then 2*b*s sums and target logits), counted on every device.
  const double tp_message = sbh * o.activation_bytes;
  const int tp_collectives = 4 + (plan.recompute ? 2 : 0);
  e.tp.size = plan.t;
  e.tp.link = GroupLink(plan.t, plan.t, cluster.devices_per_node);
  if (plan.t > 1) {
    const double bw = Bandwidth(e.tp.link, cluster);
    const double lat = Latency(e.tp.link, cluster);
    const double count = m * (layers_per_device * tp_collectives + 2);
    const double stats = 4 * static_cast<double>(plan.micro_batch_size * spec.seq_len);
    e.tp.bytes_per_step = 2 * (t - 1) / t * (count * tp_message + m * 3 * stats);
    e.tp.time_s = count * RingAllReduceSeconds(plan.t, tp_message, bw, lat) +
                  m * (RingAllReduceSeconds(plan.t, stats, bw, lat) +
                       RingAllReduceSeconds(plan.t, 2 * stats, bw, lat));
    // Measured among devices computing beside each other: on shared cores a peer is often
    // descheduled when its partner arrives, which the link alone does not show.
    e.tp.time_s =
        std::max(e.tp.time_s,
                 (count + 2 * m) * MeasuredTpCollective(spec, o, plan.t, plan.micro_batch_size));
    e.tp.exposed_s = e.tp.time_s;
  }

  // Pipeline parallelism: each micro-batch sends its activations forward and their gradients
  // back across every chunk boundary, v chunks per device; blocking sends, so exposed.
  const bool split_sends = o.pipeline_scatter_gather || o.sequence_parallel;
  const double pp_message = tp_message / (split_sends ? t : 1);
  e.pp.size = plan.p;
  e.pp.link =
      GroupLink(plan.p, static_cast<int64_t>(plan.t) * plan.d * plan.p, cluster.devices_per_node);
  if (plan.p > 1) {
    const double sends = 2 * plan.v * m;
    e.pp.bytes_per_step = sends * pp_message;
    e.pp.time_s =
        sends * (pp_message / Bandwidth(e.pp.link, cluster) + Latency(e.pp.link, cluster));
    e.pp.exposed_s = e.pp.time_s;
  }

  e.bubble_fraction = BubbleFraction(plan);
  if (pass != nullptr && pass->weight_share > 0 && plan.schedule == Schedule::kZeroBubbleH1) {
    // Qi et al.'s (p-1)(F + b - W) with the measured passes, F + b + W = 1.
    e.bubble_fraction = BubbleFraction(plan) * 3 * std::max(0.0, 1 - 2 * pass->weight_share);
  }
  // The stages' busy time stretched by the bubble; with more devices than cores the busy time
  // was measured with every device sharing a core, and idle stages give theirs back: the
  // pipeline then takes the longer of the two, but keeps the part of the bubble a waiting
  // stage's core does not hand over (shared_core_bubble_kept).
  const double busy = e.compute_s + e.tp.exposed_s + e.pp.exposed_s;
  e.bubble_s = busy * std::max({0.0, (1 + e.bubble_fraction) / cluster.oversubscription - 1,
                                o.shared_core_bubble_kept * e.bubble_fraction});

  // Data parallelism: a ring all-reduce of this device's gradients (ZeRO-1/2: reduce-scatter
  // plus all-gather, the same volume; ZeRO-3 adds an all-gather of the weights in the forward
  // and another in the backward, Rajbhandari et al. 2020 Sec. 7). It can hide only behind the
  // last micro-batch's backward, 2/3 of its compute (3/4 with the recomputed forward).
  const double params = static_cast<double>(ParameterCount(spec)) / (t * plan.p);
  const double dp_message = params * o.gradient_bytes;
  e.dp.size = plan.d;
  e.dp.link = GroupLink(plan.d, static_cast<int64_t>(plan.t) * plan.d, cluster.devices_per_node);
  if (plan.d > 1) {
    const double dd = plan.d;
    const double bw = Bandwidth(e.dp.link, cluster);
    const double lat = Latency(e.dp.link, cluster);
    e.dp.bytes_per_step = 2 * (dd - 1) / dd * dp_message;
    e.dp.time_s = RingAllReduceSeconds(plan.d, dp_message, bw, lat);
    if (plan.zero_stage >= 3) {
      const double weights = params * o.param_bytes;
      e.dp.bytes_per_step += 2 * (dd - 1) / dd * weights;
      e.dp.time_s += 2 * ((dd - 1) / dd * weights / bw + (dd - 1) * lat);
    }
    const double last_backward = e.compute_s / m * (plan.recompute ? 3.0 / 4 : 2.0 / 3);
    e.dp.exposed_s = e.dp.time_s - std::min(o.dp_overlap_fraction * e.dp.time_s, last_backward);
  }

  // Adam streams its state once per step: memory-bound, on the shard this device updates.
  if (cluster.memory_bandwidth > 0) {
    const double updated = params / (plan.zero_stage >= 1 ? plan.d : 1);
    e.optimizer_s = updated * o.optimizer_step_bytes / cluster.memory_bandwidth;
  }

  e.tp_exposed_s = e.tp.exposed_s;
  e.pp_exposed_s = e.pp.exposed_s;
  e.dp_exposed_s = e.dp.exposed_s;
  e.step_time_s =
      e.compute_s + e.tp_exposed_s + e.pp_exposed_s + e.bubble_s + e.dp_exposed_s + e.optimizer_s;
  e.tokens_per_s =
      static_cast<double>(global_batch) * static_cast<double>(spec.seq_len) / e.step_time_s;
  e.model_tflops_per_device = e.flops_per_step / e.step_time_s / cluster.devices / 1e12;
  e.memory = EstimateMemory(spec, plan, cluster, o, tp_message, pp_message, dp_message);
  return e;
}

}  // namespace kc::parallel::planner
