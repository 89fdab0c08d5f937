// Published training runs as planner checks: a JSON array of cases, each a model, a cluster,
// a global batch and the published plan with its achieved TFLOP/s per device (the schema of
// docs/user-guide/plan.md, "Checking the planner against published runs"). For each, the
// cost model's prediction for the published plan and the plan the search chooses.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/search.h"

namespace kc::parallel::planner {

struct PublishedCase {
  std::string id;
  ModelSpec spec;
  ClusterSpec cluster;
  int64_t global_batch = 0;
  ParallelPlan plan;            // the published one; micro-batch 1 and v = 2 where unstated
  CostModelOptions options;     // sequence parallelism and selective recompute as published
  double published_tflops = 0;  // model TFLOP/s per device
};

// Reads a cases file. kNotFound when it does not exist; kInvalidArgument, as
// "FILE: case N (ID): key: what", for a missing or mistyped key, or a case that is not an
// object. The device memory bandwidth, absent from the schema, comes from the cluster's
// "memory_GBps" when given, else from the datasheet of a known gpu_type (A100, H100, V100),
// else 0 (the optimizer step counted free).
Result<std::vector<PublishedCase>> LoadCases(const std::string& path);

struct CaseResult {
  PlanEstimate published;              // the published plan's estimate
  std::optional<RankedPlan> chosen;    // the search's best; empty when nothing fits
  Status search_status;                // why chosen is empty
  std::optional<RankedPlan> baseline;  // the seed's rules; empty when they find nothing
};

// Estimates the published plan and searches. Errors only when the published plan itself is
// invalid for the case (e.g. t·p·d differs from the device count).
Result<CaseResult> EvaluateCase(const PublishedCase& c);

}  // namespace kc::parallel::planner
