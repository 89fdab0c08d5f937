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
  // The published plan. Where the paper leaves a value unstated the loader chooses one that
  // fits the plan rules: micro-batch 1; with pp > 1 the interleaved schedule with v = 2, else
  // the smallest v that divides the layers per stage, else 1F1B (v = 1).
  ParallelPlan plan;
  std::vector<std::string> assumed;  // each value chosen so, e.g. "v=3 (unstated; v=2 ...)"
  CostModelOptions options;          // sequence parallelism and selective recompute as published
  double published_tflops = 0;       // model TFLOP/s per device
};

// One case of a cases file: read, or why it could not be.
struct LoadedCase {
  int index = 0;        // its place in the file, from 1
  std::string id;       // empty when the case names none
  Status status;        // kInvalidArgument "FILE: case N (ID): key: what" for a malformed case
  PublishedCase value;  // when status is ok
};

// Reads a cases file, each case on its own: a malformed one (a missing or mistyped key, not
// an object, a published plan that breaks the plan rules) carries its error and the rest are
// read. kNotFound when the file does not exist; kInvalidArgument when it is not a JSON array.
// The device memory bandwidth, absent from the schema, comes from the cluster's
// "memory_GBps" when given, else from the datasheet of a known gpu_type (A100, H100, V100),
// else 0 (the optimizer step counted free).
Result<std::vector<LoadedCase>> LoadCases(const std::string& path);

struct CaseResult {
  PlanEstimate published;              // the published plan's estimate
  std::optional<RankedPlan> chosen;    // the search's best; empty when nothing fits
  Status search_status;                // why chosen is empty
  std::optional<RankedPlan> baseline;  // the seed's rules; empty when they find nothing
};

// Estimates the published plan with the case's options (the published runs' engine: no
// data-parallel overlap), and searches with Kuangchao's (kEngineDpOverlap). Errors only when
// the published plan itself is invalid for the case (e.g. t·p·d differs from the device
// count).
Result<CaseResult> EvaluateCase(const PublishedCase& c);

}  // namespace kc::parallel::planner
