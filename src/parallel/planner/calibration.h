// Calibration on real hardware (`kc plan --calibrate`): the cost model's constants measured on
// this machine for one model. The engine's own forward and backward (Gpt<float>) are timed
// at several micro-batch sizes on every device at once, and the matmul-efficiency curve of the
// cost model fitted to them; the optimizer step is timed and turned into the bytes per
// parameter the model streams; peak FLOP/s and bandwidths come from L1's measurements.
// docs/design/planner-cost-model.md, "Calibration".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "parallel/model_spec.h"
#include "parallel/planner/cost_model.h"

namespace kc::parallel::planner {

// One timed micro-batch size.
struct EfficiencyPoint {
  int64_t micro_batch_size = 0;
  double size = 0;        // micro_batch_size * seq_len * hidden: the cost model's abscissa
  double seconds = 0;     // forward + backward of one micro-batch, median, mean over devices
  double efficiency = 0;  // model FLOPs (Korthikanti eq. 7) / seconds / peak_flops
};

struct EfficiencyFit {
  double matmul_efficiency = 0;     // CostModelOptions::matmul_efficiency
  double efficiency_half_size = 0;  // CostModelOptions::efficiency_half_size
};

// Fits eff(size) = E * size / (size + H) to the points by least squares on 1/eff, which is
// linear in 1/size: 1/eff = 1/E + (H/E) / size. A falling or flat curve gives H = 0 and E the
// mean. REQUIRES: at least one point with efficiency > 0.
EfficiencyFit FitEfficiency(std::span<const EfficiencyPoint> points);

// The points as CostModelOptions::efficiency_points: (size, efficiency), sorted by size, one
// per size (the first kept), points without a positive efficiency left out.
std::vector<std::pair<double, double>> EfficiencyTable(std::span<const EfficiencyPoint> points);

struct CalibrationOptions {
  std::vector<int64_t> micro_batch_sizes = {1, 2, 4, 8};
  int repetitions = 3;  // timed passes per size, after one untimed; the median is kept
  // The cores of each device, one entry per device; all devices run at once, as they do in
  // training, each on its own thread pinned to its cores. Must not be empty.
  std::vector<std::vector<int>> device_cpus;
  double peak_flops = 0;  // per device: what the efficiency is relative to (> 0)
};

struct ComputeCalibration {
  std::vector<EfficiencyPoint> points;
  EfficiencyFit fit;
  double optimizer_seconds = 0;  // clip-norm + AdamW step over every parameter, per device
};

// Times the model's forward + backward at each micro-batch size on every device at once, and
// the optimizer step. kInvalidArgument for an invalid spec, no devices or sizes, a
// non-positive peak; kResourceExhausted when a model does not fit in memory. Takes a few
// seconds for gpt-tiny.
Result<ComputeCalibration> MeasureCompute(const ModelSpec& spec, const CalibrationOptions& options);

// What `kc plan --calibrate` saves and `kc plan --cluster FILE` / `kc train --plan auto` read:
// the measured cluster and the cost-model constants, with the points they came from (loading
// makes them the options' efficiency_points).
struct Calibration {
  std::string host;
  std::string model;  // the model the compute was timed with
  int cpus_per_device = 0;
  ClusterSpec cluster;
  CostModelOptions options;
  std::vector<EfficiencyPoint> points;
};

std::string CalibrationToJson(const Calibration& c);
// kNotFound when the file does not exist; kInvalidArgument naming the file and the key.
Result<Calibration> LoadCalibration(const std::string& path);
Result<Calibration> CalibrationFromJson(std::string_view text, const std::string& display_name);

}  // namespace kc::parallel::planner
