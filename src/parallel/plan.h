// A parallel plan: how a model is cut over ranks (tensor × pipeline × data parallel) and how
// each step is scheduled. The planner produces plans, `kc train --plan` runs them, and both
// check them with ValidatePlan. Format and rules: docs/user-guide/plans.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "parallel/model_spec.h"

namespace kc::parallel {

// Pipeline schedules.
enum class Schedule : uint8_t {
  kGpipe = 0,        // all forwards, then all backwards (Huang et al. 2019)
  k1F1B = 1,         // one forward, one backward in steady state (Narayanan et al. 2019)
  kInterleaved = 2,  // 1F1B over v model chunks per stage (Narayanan et al. 2021)
  kZeroBubbleH1 = 3  // backward split into input and weight passes (Qi et al. 2023, ZB-H1)
};
std::string_view ScheduleName(Schedule s);  // "gpipe", "1f1b", "interleaved", "zb-h1"

struct ParallelPlan {
  int t = 1;                     // tensor-parallel ranks per layer
  int p = 1;                     // pipeline stages
  int d = 1;                     // data-parallel replicas
  int64_t micro_batch_size = 1;  // sequences per micro-batch
  int64_t micro_batches = 1;     // m: micro-batches per step per replica
  Schedule schedule = Schedule::k1F1B;
  int v = 1;               // model chunks per stage (interleaved only)
  bool recompute = false;  // recompute activations in the backward instead of keeping them
  int zero_stage = 0;      // 0: none; 1: optimizer state sharded over d; 2, 3: ZeRO-2/3 (planner)

  int world() const { return t * p * d; }
  // Sequences per step over all replicas: micro_batch_size * micro_batches * d.
  int64_t global_batch() const { return micro_batch_size * micro_batches * d; }

  friend bool operator==(const ParallelPlan&, const ParallelPlan&) = default;
};

// Which of the batch keys a plan file or flag stated; the ones left out follow the global
// batch (FillBatchDefaults).
struct PlanKeys {
  bool micro_batch_size = false;
  bool micro_batches = false;
};

// Reads a plan file (YAML; keys t, p, d, micro_batch_size, micro_batches, schedule, v,
// recompute, zero_stage; all optional but one per file at least). kNotFound for a missing
// file; kInvalidArgument as "FILE:LINE: key: what" for an unknown key, a wrong type or an
// out-of-range value. Does not check the plan against a model: see ValidatePlan. `stated`,
// when given, says which batch keys the file has.
Result<ParallelPlan> LoadPlan(const std::string& path, PlanKeys* stated = nullptr);
// The same for YAML text in memory; `display_name` stands for the file in errors.
Result<ParallelPlan> LoadPlanFromString(std::string_view text, std::string display_name,
                                        PlanKeys* stated = nullptr);
// The command-line form, "t=2,p=2,d=1,micro_batches=8,schedule=1f1b": key=value pairs with
// the file's keys, separated by commas or spaces (PlanToString's line reads back as it is).
// Errors name "--plan" and the key.
Result<ParallelPlan> ParsePlanFlag(std::string_view text, PlanKeys* stated = nullptr);

// `plan` with the batch keys it did not state taken from a global batch of `global_batch`
// sequences, each of the d replicas taking global_batch / d of them:
//   micro_batches stated: micro_batch_size = the replica's share / micro_batches;
//   micro_batch_size stated: micro_batches = the share / micro_batch_size;
//   neither: without a pipeline one micro-batch of the whole share; with p stages the largest
//     count of micro-batches in [p, 4p] that divides the share (a multiple of p when
//     interleaved), else the smallest above that does, and the size that makes the share.
// A key that cannot be made to fit (d or the stated key does not divide) keeps its value, for
// ValidatePlan to say what would. Both stated: `plan` as it is.
ParallelPlan FillBatchDefaults(ParallelPlan plan, PlanKeys stated, int64_t global_batch);

// One line, "t=2 p=2 d=1 micro_batch_size=4 micro_batches=8 schedule=1f1b v=1
// recompute=false zero_stage=0"; ParsePlanFlag reads it back.
std::string PlanToString(const ParallelPlan& plan);
// The plan file for `plan`; LoadPlanFromString gives back an equal plan.
std::string PlanToYaml(const ParallelPlan& plan);

// Whether `plan` can run `spec` on `world_size` ranks with a global batch of `global_batch`
// sequences (0: not checked). kInvalidArgument naming the first rule broken, with the values
// that would work:
//   t * p * d == world_size;
//   t divides heads and ffn_hidden (Megatron's column/row splits; the vocabulary is padded to
//     a multiple of t instead, as Megatron pads it);
//   p * v <= layers (every model chunk holds a layer);
//   v == 1 unless the schedule is interleaved; interleaved: v >= 2, p >= 2, layers divisible
//     by p * v, micro_batches divisible by p;
//   1F1B, interleaved and ZB-H1: micro_batches >= p;
//   micro_batch_size * micro_batches * d == global_batch;
//   zero_stage in 0..3.
Status ValidatePlan(const ParallelPlan& plan, const ModelSpec& spec, int world_size,
                    int64_t global_batch);

// The divisors of n in increasing order (for "what would work" messages and the planner's
// search).
std::vector<int64_t> Divisors(int64_t n);

}  // namespace kc::parallel
