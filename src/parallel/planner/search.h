// The planner's search: every plan for a model on a cluster (t × p × d, micro-batch size,
// schedule and v, recompute, ZeRO-1), each estimated by the cost model, the fastest that fits
// first, and the next best with the reason each lost. Also the seed's rule-of-thumb plan, the
// baseline the search is measured against.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"
#include "parallel/planner/cost_model.h"

namespace kc::parallel::planner {

// What the user narrows the search to. What the engine runs is not a constraint: the search
// asks EngineSupports(plan, cluster.device) of every plan.
struct SearchConstraints {
  int fixed_t = 0;             // 0: any
  int max_p = 0;               // 0: any
  double memory_headroom = 0;  // keep this fraction of the usable memory free, [0, 1)
  int64_t max_micro_batch_size = 8;
  bool allow_recompute = true;
  int max_zero_stage = 3;
};

struct RankedPlan {
  ParallelPlan plan;
  PlanEstimate estimate;
  // For an alternative: why it lost to the best, e.g. "slower: +12% step time, mostly
  // pipeline bubble (+40 ms)". Empty for the best.
  std::string reason;
};

struct SearchResult {
  std::vector<RankedPlan> ranked;  // fitting plans, fastest first (at most `keep`)
  // The fastest plan of all when it does not fit (so it lost on memory), its reason saying by
  // how much it would have been faster and what it needs; empty when the fastest plan fits.
  std::optional<RankedPlan> fastest_unfit;
  int64_t evaluated = 0;  // plans estimated
  int64_t fitting = 0;    // of those, plans that fit in memory
};

// Searches every valid plan the engine runs (EngineSupports on cluster.device) for
// `global_batch` sequences on cluster.devices devices, with tensor-parallel groups that each
// lie wholly inside one node (t divides devices_per_node).
// kInvalidArgument for a global batch no plan can split, kResourceExhausted when no plan fits
// in memory, naming the smallest memory per device the best plan would need and the device
// count that would do.
Result<SearchResult> SearchPlans(const ModelSpec& spec, const ClusterSpec& cluster,
                                 int64_t global_batch, const SearchConstraints& constraints = {},
                                 const CostModelOptions& options = {}, int keep = 5);

// The seed's rules: tensor parallel first when one layer's parameters take more than 60% of a
// device's memory (the smallest t that brings them under), pipeline parallel when the model's
// training state does not fit in the devices of the tensor-parallel group (the smallest p that
// fits), data parallel with the rest; micro-batch 1, 1F1B, recompute only if it does not fit
// otherwise. kResourceExhausted when the rules find no plan that fits.
Result<RankedPlan> BaselinePlan(const ModelSpec& spec, const ClusterSpec& cluster,
                                int64_t global_batch, const CostModelOptions& options = {});

}  // namespace kc::parallel::planner
