// What `kc train` shows and writes about a run: the live progress line, the end-of-run
// summary (the seed's validation metrics) and the loss-curve plot (SVG).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kc::app {

// One training step as rank 0 reports it (a "step" line of the metrics file).
struct StepRecord {
  int64_t step = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_s = 0;
  double compute_s = 0;
  double comm_exposed_s = 0;
  double tp_comm_s = 0;              // of which rank 0's tensor-parallel all-reduces
  int64_t tokens = 0;                // global batch tokens
  std::vector<double> stage_bubble;  // pipelines: each stage's bubble fraction
};

// A validation loss after `step` steps (a "val" line).
struct ValRecord {
  int64_t step = 0;
  double loss = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t measured_steps = 0;  // the steady-state steps the rates below average over
  double first_loss = 0;
  double last_loss = 0;     // mean of the last min(10, steps) losses
  double tokens_per_s = 0;  // steady state
  double step_ms_median = 0;
  double device_utilisation = 0;      // compute time / step time, steady state
  double exposed_comm_share = 0;      // exposed communication time / step time, steady state
  double comm_exposed_ms = 0;         // mean per steady-state step
  double comm_exposed_ms_median = 0;  // median per steady-state step (robust to a slow step)
  double tp_comm_ms_median = 0;       // the tensor-parallel all-reduces' part of it
  double total_s = 0;                 // all steps
  std::vector<double> stage_bubble;   // pipelines: each stage's median bubble, steady state
};

// Steady state leaves out the first steps / 10 steps, at least 1 and at most 10 (page
// faults, first touch of the arena, BLAS thread start-up).
TrainSummary Summarise(const std::vector<StepRecord>& steps);

// "step  120/300 [=======>      ]  40%  loss 2.431  val 2.503  12.3k tok/s  ETA 0:42", at most
// `width` columns. val < 0: none yet.
std::string ProgressLine(int64_t step, int64_t total, double loss, double val, double tokens_per_s,
                         double eta_s, int width);

// The losses smoothed as TensorBoard's slider does: an exponential moving average with
// `weight` on the past, started from zero and debiased (divided by 1 - weight^n after n
// finite losses), so the first steps are not dragged towards the first loss. NaN where the
// loss is not finite.
std::vector<double> SmoothedLosses(const std::vector<StepRecord>& steps, double weight = 0.9);

// The training loss (raw, faint, and smoothed) and validation losses against the step, as a
// self-contained SVG document.
std::string LossCurveSvg(const std::string& title, const std::vector<StepRecord>& steps,
                         const std::vector<ValRecord>& val);

// "1:05", "12:03:09".
std::string FormatDuration(double seconds);

}  // namespace kc::app
