// The planner's cost model: for a model, a parallel plan and a cluster, the predicted step
// time (and its parts), throughput, per-device memory and per-group traffic. Analytic, from
// the published Megatron-LM formulas; every formula, its source and the constants are in
// docs/design/planner-cost-model.md. Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "hal/device.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"

namespace kc::parallel::planner {

// The hardware a plan runs on. Homogeneous: every device and node alike.
struct ClusterSpec {
  int devices = 1;                    // the world size
  int devices_per_node = 1;           // devices sharing the intra-node link (NVLink)
  double peak_flops = 0;              // dense 16-bit matmul FLOP/s per device
  double memory_bytes = 0;            // device memory per device
  double memory_bandwidth = 0;        // device-memory bytes/s per device; 0: optimizer step free
  double intra_node_bandwidth = 0;    // bytes/s per direction per device inside a node
  double inter_node_bandwidth = 0;    // bytes/s per direction per device across nodes (its NIC)
  double intra_node_latency = 2e-6;   // seconds per ring step inside a node
  double inter_node_latency = 10e-6;  // seconds per ring step across nodes
  // The kind of device the engine runs on (EngineSupports asks it); kSimulated: declared only,
  // planned for what the engine runs on any kind.
  hal::DeviceKind device = hal::DeviceKind::kSimulated;
  // Devices per core when more devices than cores share a host (CPU ranks time-sliced), else
  // 1. Its measured passes ran so shared; a pipeline stage that waits lends its core to the
  // others, so the bubble costs only what the shared cores cannot absorb.
  double oversubscription = 1;
};

// The share of the data-parallel all-reduce Kuangchao's trainer can hide where its transfers
// run beside the compute (GPUs and NICs): its gradient buckets start during the last
// micro-batch's backward, in backward order, so all of the all-reduce may hide behind that
// backward (EstimatePlan caps the hidden part at its length). A bound of the design, not a
// GPU measurement (the engine has none yet). On CPU ranks the reduction shares the ranks'
// cores with the backward and takes turns with it: kc plan --calibrate measures that
// (MeasureOverlap; none on this machine's one-core ranks), and a CPU host not calibrated is
// planned with none.
inline constexpr double kEngineDpOverlap = 1.0;

// One micro-batch's passes timed on a device (kc plan --calibrate): at tensor-parallel size t
// the device ran its 1/t share of every layer, without the group's all-reduces.
struct MeasuredPass {
  int t = 1;
  int64_t micro_batch_size = 1;
  double seconds = 0;        // forward + backward through every layer
  double block_seconds = 0;  // of which one transformer block's; 0: by LayerCosts' shares
  double forward_share = 0;  // the forward's part of seconds; 0: a third
  double weight_share = 0;   // ZB-H1's weight pass's part of forward + backward; 0: a third
  // t > 1: `seconds` with the tensor-parallel group communicating, among devices that compute
  // beside it (transfer, rendezvous and descheduled peers); 0: not measured, the link's
  // bandwidth and latency alone price the all-reduces.
  double tp_comm_seconds = 0;
};

// The tensor-parallel all-reduces of one micro-batch's forward + backward through every
// layer, without recompute: four per layer, and four for the vocabulary-parallel embeddings,
// head and loss.
double TensorParallelCollectives(const ModelSpec& spec);

// The matmul efficiency of a CPU device not calibrated (the curve's, no width term).
inline constexpr double kCpuMatmulEfficiency = 0.55;

// Constants of the engine and the numerics. One set serves every model, plan and cluster.
struct CostModelOptions {
  double activation_bytes = 2;  // per activation element in the compute precision (bf16/fp16)
  double param_bytes = 2;       // per weight in the compute precision
  double gradient_bytes = 2;    // per gradient element, also the all-reduce dtype
  double optimizer_bytes = 12;  // per parameter: fp32 master copy, Adam m and v
  // The matmul efficiency: the fraction of peak_flops reached on large matmuls, and the size at
  // which it halves. The size is micro_batch_size * seq_len * hidden / t, the activation
  // elements of one micro-batch on one device (the M*K of its matmuls).
  double matmul_efficiency = 0.63;
  double efficiency_half_size = 131072;  // 2^17: e.g. 128 tokens of 1024 per device
  // And the model's width: every layer's matmuls share the dimension `hidden` (tensor
  // parallelism splits the other), and wider matmuls run closer to peak; the curve is scaled by
  // hidden / (hidden + efficiency_half_hidden). Fitted to the published Megatron-LM runs
  // (docs/design/planner-cost-model.md); 0: no width term (a calibration, measured on the
  // model it plans, has it in its points). Below efficiency_min_hidden, the narrowest of those
  // runs, the width term keeps its value there: it is not extrapolated (small models reach
  // high efficiencies with newer kernels than those runs had).
  double efficiency_half_hidden = 720;
  double efficiency_min_hidden = 2304;
  // Efficiencies measured at given sizes (`kc plan --calibrate`), sorted by size, both
  // positive. Inside their range they replace the curve, linear in log(size) between points;
  // outside it the curve is scaled to meet the nearest point. Empty: the curve alone.
  std::vector<std::pair<double, double>> efficiency_points;
  // Passes timed on this machine for the model planned. A plan whose (t, micro-batch size) is
  // among them is timed from them rather than from FLOPs: each pipeline stage's chunks
  // (BalanceStages' split, as the trainer cuts them) cost their blocks at block_seconds and
  // the last one the head's remainder, the slowest stage setting the pace; ZB-H1's bubble
  // uses the measured weight pass. Empty: FLOPs and the efficiency for every plan.
  std::vector<MeasuredPass> measured_passes;
  // The fraction of the data-parallel all-reduce hidden behind the backward of the last
  // micro-batch (never more than that backward lasts). 0: none, as in the published
  // Megatron-LM runs; Kuangchao's trainer: kEngineDpOverlap, or what kc plan --calibrate
  // measured on CPU ranks.
  double dp_overlap_fraction = 0;
  // Megatron sequence parallelism (Korthikanti et al. 2022): the non-matmul activations are
  // split over t; all-gather + reduce-scatter replace each all-reduce at the same volume.
  bool sequence_parallel = false;
  // Megatron selective recompute (Korthikanti et al. 2022 Sec. 5), for plans without full
  // recompute: the attention core (softmax, its dropout, QK^T and AV) is recomputed rather
  // than kept, dropping 5as/h from the activations and adding its forward FLOPs again (eq. 8).
  // The plan format has no field for it yet, hence an option.
  bool selective_recompute = false;
  // Pipeline sends split over the t ranks of a stage and gathered over the intra-node link
  // (Narayanan et al. 2021, Sec. 4.1); always so with sequence_parallel.
  bool pipeline_scatter_gather = true;
  // Adam's step streams this many bytes of device memory per parameter it updates (read
  // master, m, v, gradient; write master, m, v, weight): a memory-bound pass.
  double optimizer_step_bytes = 34;
  double usable_memory_fraction = 0.9;  // the rest: runtime context, allocator fragmentation
  double dp_bucket_bytes = 2 << 20;     // one gradient bucket (TrainerOptions::bucket_bytes)
  // With more devices than cores (ClusterSpec::oversubscription > 1): the part of a pipeline
  // stage's idle time its core does not give to another device (the hand-off: the waiting
  // rank wakes, the next one refills its caches). 0.17 to 0.34 of the bubble measured on a
  // 2-core machine with 3 and 4 ranks (bench/plan); on dedicated cores the whole bubble is
  // kept anyway. [0, 1].
  double shared_core_bubble_kept = 0.2;
};

enum class Link : uint8_t { kNone = 0, kIntraNode = 1, kInterNode = 2 };
std::string_view LinkName(Link link);  // "none", "intra-node", "inter-node"

// The traffic of one parallel group (tp, pp or dp) as one device sees it.
struct GroupTraffic {
  int size = 1;               // ranks in the group
  Link link = Link::kNone;    // kNone when size == 1
  double bytes_per_step = 0;  // bytes this device sends per step
  double time_s = 0;          // the group's communication time per step
  double exposed_s = 0;       // the part of time_s the step waits for
};

// Per-device memory in bytes; activations are those of the device that holds the most.
struct MemoryEstimate {
  double weights = 0;
  double gradients = 0;
  double optimizer_state = 0;
  double activations = 0;
  double communication_buffers = 0;
  double total = 0;
  double capacity = 0;  // memory_bytes * usable_memory_fraction
  bool fits = false;    // total <= capacity
};

struct PlanEstimate {
  double step_time_s = 0;  // compute + tp + pp + dp exposed + bubble + optimizer
  double compute_s = 0;    // the device's matmul FLOPs over peak * efficiency, bubble-free
  double tp_exposed_s = 0;
  double pp_exposed_s = 0;
  double dp_exposed_s = 0;
  double bubble_s = 0;
  double optimizer_s = 0;        // the memory-bound optimizer step
  double bubble_fraction = 0;    // bubble time over the bubble-free pipeline time
  double matmul_efficiency = 0;  // the efficiency compute_s assumed
  double flops_per_step = 0;     // model FLOPs per step, all devices (Narayanan eq. 3 / K. eq. 7)
  double hardware_flops_per_step = 0;  // those executed, with selective recompute's (K. eq. 8)
  double tokens_per_s = 0;
  double model_tflops_per_device = 0;  // flops_per_step / step_time_s / devices / 1e12
  MemoryEstimate memory;
  GroupTraffic tp;
  GroupTraffic pp;
  GroupTraffic dp;
};

// FLOPs per training step for `global_batch` sequences: Narayanan et al. 2021 eq. 3,
// 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)), with full recompute; Korthikanti et al. 2022 eq. 7,
// 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)), without. The "1" is (4h + 2F)/(12h), which is 1 at
// the papers' F = 4h.
double StepFlops(const ModelSpec& spec, int64_t global_batch, bool recompute);

// Time of a ring all-reduce of `bytes` over `n` ranks: 2(n-1)/n * bytes / bandwidth plus
// 2(n-1) steps of `latency`. 0 for n == 1.
double RingAllReduceSeconds(int n, double bytes, double bandwidth, double latency);

// The pipeline bubble over the bubble-free time: (p-1)/m for GPipe and 1F1B, (p-1)/(m*v) for
// interleaved, (p-1)/(3m) for ZB-H1.
double BubbleFraction(const ParallelPlan& plan);

// The matmul efficiency the options give at `size` (micro_batch_size * seq_len * hidden / t):
// the curve matmul_efficiency * size / (size + efficiency_half_size), or the measured points;
// the curve alone times the width term hidden / (hidden + efficiency_half_hidden) when that
// is set.
double MatmulEfficiency(const CostModelOptions& options, double size, double hidden);

// Micro-batches whose activations the first pipeline stage holds at its peak: m for GPipe,
// min(p, m) for 1F1B and ZB-H1, p(1 + (p-1)/(pv)) interleaved.
double MicroBatchesInFlight(const ParallelPlan& plan);

// The activation bytes one layer keeps for one micro-batch on one device (Korthikanti et al.
// 2022 Sec. 4, scaled to options.activation_bytes): `kept` until its backward, `full` while a
// recomputed layer is rebuilt (equal without recompute).
struct LayerActivations {
  double kept = 0;
  double full = 0;
};
LayerActivations ActivationBytesPerLayer(const ModelSpec& spec, const ParallelPlan& plan,
                                         const CostModelOptions& options);

// The estimate for running `spec` with `plan` on `cluster` at `global_batch` sequences per
// step. kInvalidArgument if the plan breaks ValidatePlan for cluster.devices ranks, or the
// cluster has a non-positive size, rate or capacity.
Result<PlanEstimate> EstimatePlan(const ModelSpec& spec, const ParallelPlan& plan,
                                  const ClusterSpec& cluster, int64_t global_batch,
                                  const CostModelOptions& options = {});

}  // namespace kc::parallel::planner
