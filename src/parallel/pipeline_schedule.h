// Pipeline schedules: which forward and backward passes each pipeline stage runs, in which
// order, for GPipe, 1F1B, interleaved 1F1B and ZB-H1; a simulator that times a schedule from
// per-pass costs (the bubble per stage, the activations each stage holds at its peak); and the
// split of a model's layers into stages balanced by cost rather than by count.
// docs/design/pipeline-schedules.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"

namespace kc::parallel {

enum class PipeOpKind : uint8_t {
  kForward,         // F: the chunk's forward of one micro-batch; keeps its activations
  kBackward,        // B: input and weight gradients together; frees the activations
  kBackwardInput,   // ZB-H1's B: the input gradient only, sent to the previous stage at once
  kBackwardWeight,  // ZB-H1's W: the weight gradient; frees the activations
};
char PipeOpLetter(PipeOpKind kind);  // 'F', 'B', 'b', 'W'

// One pass of one micro-batch through one model chunk of a stage. With v chunks per stage
// (interleaved), stage s holds the virtual stages s, s + p, ..., s + (v - 1) p; chunk c is
// virtual stage c * p + s. Otherwise v = 1 and chunk is 0.
struct PipeOp {
  PipeOpKind kind = PipeOpKind::kForward;
  int micro_batch = 0;
  int chunk = 0;
  friend bool operator==(const PipeOp&, const PipeOp&) = default;
};

// The passes of every stage (index 0..p-1), each in its execution order. Stages exchange
// activations forward and gradients backward between consecutive virtual stages; a stage runs
// its list in order, each pass as soon as its input has arrived.
//   GPipe: all forwards, then all backwards (Huang et al. 2019).
//   1F1B: p - s - 1 forwards of warm-up, then one forward and one backward in turn, then the
//     remaining backwards (Narayanan et al. 2019, PipeDream-Flush): at most p - s micro-batches
//     of activations held by stage s.
//   interleaved: Megatron-LM's 1F1B over v chunks per stage, micro-batches in groups of p per
//     chunk (Narayanan et al. 2021, Sec. 2.2); m must be a multiple of p.
//   ZB-H1: 1F1B with every backward split into b (input gradient) and W (weight gradient), so
//     the backward chain between stages waits on b alone; stage s puts each W off by s
//     backwards, filling the time it would idle at the end (Qi et al. 2023, ZB-H1: bubble
//     (p - 1)(F + b - W) against 1F1B's (p - 1)(F + b + W); at most p micro-batches held on
//     any stage, as in 1F1B).
// kInvalidArgument (naming the value) for p < 1, m < 1, v < 1, v > 1 with a schedule other
// than interleaved, interleaved with p < 2 or m not a multiple of p.
Result<std::vector<std::vector<PipeOp>>> BuildPipelineSchedule(Schedule schedule, int p, int m,
                                                               int v = 1);

// What one pass costs, in any time unit, for one micro-batch through one whole stage (a chunk
// costs 1/v of it). For kBackward the cost is backward_input + backward_weight.
struct PipeCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  double send = 0;  // from the end of a pass to its consumer's start on the next stage
};

struct StageTimeline {
  double busy = 0;             // the sum of its passes
  double idle = 0;             // makespan - busy: waiting for inputs, and the flush
  double bubble_fraction = 0;  // idle / makespan
  int peak_activations = 0;    // micro-batch chunks whose activations are held at once, at most
};

struct PipeOpSpan {
  int stage = 0;
  PipeOp op;
  double start = 0;
  double end = 0;
};

struct PipelineSimulation {
  double makespan = 0;  // from the first pass's start to the last pass's end, all stages
  std::vector<StageTimeline> stages;
  std::vector<PipeOpSpan> spans;  // every pass, in the order the simulation ran them
  double bubble_fraction = 0;     // idle over p * makespan: the whole pipeline's
};

// Runs `schedule` (BuildPipelineSchedule's form, v chunks per stage) with `costs`: each stage
// takes its passes in order, each starting when the stage is free and its input is there (the
// previous virtual stage's forward plus `send`; for a backward, the next virtual stage's B or
// b plus `send`, or the stage's own forward on the last virtual stage; W after its own b).
// kInvalidArgument for a schedule that deadlocks (naming the stage and the pass that waits
// forever), repeats or misses a pass, or mixes B with b/W for one micro-batch.
Result<PipelineSimulation> SimulatePipeline(const std::vector<std::vector<PipeOp>>& schedule, int v,
                                            const PipeCosts& costs);

// The bubble fraction 1F1B and GPipe reach with equal, communication-free passes:
// (p - 1) / (m + p - 1), the idle share of the pipeline's time.
double IdealBubbleFraction(int p, int m);

// A contiguous split of `costs` (one per unit, in order) into `parts` non-empty runs that
// minimises the most expensive run; the returned vector holds parts + 1 boundaries, the first
// 0 and the last costs.size(). kInvalidArgument when parts < 1 or parts > costs.size(), or a
// cost is negative.
Result<std::vector<int>> PartitionByCost(std::span<const double> costs, int parts);

// The modelled cost (training FLOPs per token) of each of a GPT's layers, with the embeddings
// added to the first layer's and the final LayerNorm, the logits and the loss to the last's:
// what a pipeline stage holding them computes.
std::vector<double> LayerCosts(const ModelSpec& spec);

// The first layer of each of `stages` pipeline stages and one past the last, balanced by
// LayerCosts (so the stage with the logits gets fewer layers when the vocabulary is large).
// kInvalidArgument when stages < 1 or stages > spec.layers.
Result<std::vector<int>> BalanceStages(const ModelSpec& spec, int stages);

// "s0: F0 F1 B0 ..." per stage, chunk shown as F0.1 when v > 1: for tests and traces.
std::string ScheduleToString(const std::vector<std::vector<PipeOp>>& schedule, int v);

}  // namespace kc::parallel
