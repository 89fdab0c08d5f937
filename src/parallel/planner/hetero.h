// Plans for clusters whose devices or links differ, priced on the devices each part of the
// plan runs on, with pipeline stages sized to their devices (as Metis does for heterogeneous
// GPUs, Um et al., USENIX ATC 2024). The homogeneous model (cost_model.h) plans every device
// and link at the cluster's weakest figures; here pipeline stage s runs on the s-th block of
// t * d devices in the topology's order (ranks: t fastest, then d, then p), its arithmetic at
// those devices' peak, its tensor- and data-parallel rings over the links their members
// actually share, and its layers are as many as its speed warrants.
// docs/design/planner-cost-model.md, "Mixed clusters".
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/search.h"

namespace kc::parallel::planner {

// One pipeline stage on its devices.
struct StageEstimate {
  int layers = 0;                // transformer blocks it holds
  std::string device_model;      // its devices' model ("mixed" when they differ)
  double micro_batch_s = 0;      // one micro-batch's forward and backward: compute and TP
  double tp_link_bandwidth = 0;  // the slowest link inside its tensor-parallel groups; 0: t = 1
  double dp_link_bandwidth = 0;  // the slowest link of its data-parallel rings; 0: d = 1
  double dp_exposed_s = 0;       // its gradient all-reduce, the part the step waits for
  double optimizer_s = 0;
  double memory_bytes = 0;  // on its fullest device
  double capacity = 0;      // usable memory of its smallest device
};

struct DeviceEstimate {
  double step_time_s = 0;  // pipeline + the slowest stage's data-parallel and optimizer time
  double pipeline_s = 0;   // the micro-batches through the stages, bubble and sends included
  double tokens_per_s = 0;
  bool fits = false;  // every stage within its devices' memory
  std::vector<StageEstimate> stages;
};

// Estimates `plan` on `topology` with stage s holding layers_per_stage[s] blocks; empty: the
// layers sized to the stages (the contiguous split that minimises the slowest stage's
// micro-batch, in whole multiples of v). Precision as ClusterFromTopology decides (fp32 when
// a device lacks bf16: `options` should then be Fp32Options). A pipeline of unequal stages
// takes m * slowest + k * (sum of the others) per step, k the schedule's share of the
// fill and drain (1 for GPipe and 1F1B, 1/v interleaved, ZB-H1's weight passes fill two
// thirds), which is the homogeneous model's (p - 1)/m bubble when the stages are equal.
// kInvalidArgument when the plan breaks ValidatePlan for the topology's devices, or
// layers_per_stage does not hold p positive counts adding up to the layers.
Result<DeviceEstimate> EstimateOnDevices(const ModelSpec& spec, const ParallelPlan& plan,
                                         const hal::Topology& topology, int64_t global_batch,
                                         const CostModelOptions& options,
                                         std::span<const int> layers_per_stage = {});

// A plan priced on the devices: with its stages sized, and with the engine's split (every
// stage's blocks by modelled cost, BalanceStages), for comparison.
struct DevicePlan {
  ParallelPlan plan;
  DeviceEstimate sized;
  DeviceEstimate balanced;
};

struct DeviceSearchResult {
  DevicePlan best;         // the fastest plan with its stages sized that fits
  DevicePlan homogeneous;  // the homogeneous search's choice, priced on the devices
  int64_t evaluated = 0;
};

// Every plan the homogeneous search finds fitting (SearchPlans with `constraints`), priced on
// the devices with stages sized; the fastest that fits wins. Errors as SearchPlans'.
Result<DeviceSearchResult> SearchOnDevices(const ModelSpec& spec, const hal::Topology& topology,
                                           const ClusterSpec& cluster, int64_t global_batch,
                                           const SearchConstraints& constraints,
                                           const CostModelOptions& options);

}  // namespace kc::parallel::planner
