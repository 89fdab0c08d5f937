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

// One timed micro-batch size at one tensor-parallel size.
struct EfficiencyPoint {
  int64_t micro_batch_size = 0;
  double size = 0;           // micro_batch_size * seq_len * hidden / t: the cost model's abscissa
  double seconds = 0;        // forward + backward of one micro-batch, median, mean over devices
  double efficiency = 0;     // model FLOPs (Korthikanti eq. 7) / t / seconds / peak_flops
  int t = 1;                 // the device ran its 1/t share of every layer (Megatron's split)
  double forward_share = 0;  // the forward's part of `seconds`; 0: not measured
  double weight_share = 0;   // ZB-H1's weight pass's part of a split pass; 0: not measured
  double block_seconds = 0;  // one transformer block's forward + backward; 0: not measured
  // t > 1: `seconds` with the group communicating (every group of t at once); 0: not measured.
  double tp_comm_seconds = 0;
};

struct EfficiencyFit {
  double matmul_efficiency = 0;     // CostModelOptions::matmul_efficiency
  double efficiency_half_size = 0;  // CostModelOptions::efficiency_half_size
};

// Fits eff(size) = E * size / (size + H) to the points by least squares on 1/eff, which is
// linear in 1/size: 1/eff = 1/E + (H/E) / size. A falling or flat curve gives H = 0 and E the
// mean. REQUIRES: at least one point with efficiency > 0.
EfficiencyFit FitEfficiency(std::span<const EfficiencyPoint> points);

// The t = 1 points as CostModelOptions::efficiency_points: (size, efficiency), sorted by
// size, one per size (the first kept), points without a positive efficiency left out.
std::vector<std::pair<double, double>> EfficiencyTable(std::span<const EfficiencyPoint> points);

// The points as CostModelOptions::measured_passes (those with a positive time).
std::vector<MeasuredPass> PassTable(std::span<const EfficiencyPoint> points);

struct CalibrationOptions {
  std::vector<int64_t> micro_batch_sizes = {1, 2, 4, 8};
  // Tensor-parallel sizes to time each micro-batch size at (each must divide the heads and
  // ffn_hidden): the device runs its 1/t share of every layer, the group's all-reduces left
  // out (MeasureLinks times them alone).
  std::vector<int> tensor_parallel = {1};
  // Also time ZB-H1's split backward (the weight pass's share) and one transformer block
  // alone (the per-layer cost pipeline stages are priced with; models of 3 layers or more).
  bool split_backward = true;
  bool block = true;
  // Also time each t > 1 that divides the devices with its groups communicating: the devices
  // in groups of t, every group at once, as a plan's tensor-parallel groups run
  // (EfficiencyPoint::tp_comm_seconds).
  bool tensor_parallel_comm = true;
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

// Times the model's forward + backward at each tensor-parallel and micro-batch size on every
// device at once (with the forward's and the weight pass's shares and one block's time as the
// options ask), and the optimizer step. kInvalidArgument for an invalid spec, no devices or
// sizes, a tensor-parallel size that does not split the model, a non-positive peak;
// kResourceExhausted when a model does not fit in memory. Takes a few seconds for gpt-tiny,
// a minute or two for gpt-small.
Result<ComputeCalibration> MeasureCompute(const ModelSpec& spec, const CalibrationOptions& options);

struct LinkCalibrationOptions {
  // The cores of each rank, one entry per rank (at least two to measure anything); each rank
  // runs on its own thread pinned to its cores (unpinned when empty), as MeasureCompute's.
  std::vector<std::vector<int>> device_cpus;
  std::vector<int64_t> sizes_bytes = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
  int repetitions = 5;  // timed all-reduces per size, after one untimed; the median is kept
  // Rounds of the rendezvous probe: every rank computes for about `work_seconds`, then
  // all-reduces a few bytes, as tensor-parallel ranks do between their products.
  int rounds = 20;
  double work_seconds = 2e-3;
};

// The engine's all-reduce between ranks of this host, through the communicator the trainer
// uses (shared memory), fitted to the cost model's ring: time = 2(k-1)/k * bytes / bandwidth
// + 2(k-1) * latency over the k ranks. The latency is the larger of the fit's and what a
// collective costs between ranks that compute in between (rendezvous): there the ranks reach
// it at different times, and with more ranks than cores a peer may be descheduled.
struct LinkCalibration {
  std::vector<std::pair<double, double>> allreduce;  // (bytes, median seconds), every size
  double bandwidth = 0;                              // bytes/s; 0 with fewer than two ranks
  double latency = 0;                                // seconds per ring step
  double rendezvous_s = 0;  // a small all-reduce's cost between computing ranks
};

// Times an all-reduce of every size over every rank at once, and the rendezvous: rounds of
// work and a 4-byte all-reduce against the same work alone, every rank at once.
// kInvalidArgument for no sizes, a size below 4 bytes, or no rounds; the communicator's
// errors otherwise. With one rank: nothing measured (everything 0). Takes about a second.
Result<LinkCalibration> MeasureLinks(const LinkCalibrationOptions& options);

struct OverlapCalibrationOptions {
  std::vector<std::vector<int>> device_cpus;  // one entry per data-parallel rank, as above
  int64_t micro_batch_size = 1;
  int64_t bucket_bytes = 2 << 20;  // TrainerOptions::bucket_bytes
  int repetitions = 3;
};

// How much of the data-parallel all-reduce the engine hides behind the backward: each rank
// runs the model's backward with the trainer's gradient buckets (comm::GradientBuckets, in
// backward order, each all-reduced as soon as it is complete), and, apart, the backward
// alone and the buckets' all-reduce alone. fraction = (backward + all-reduce - together) /
// all-reduce, clamped to [0, 1]: CostModelOptions::dp_overlap_fraction.
struct OverlapCalibration {
  double backward_s = 0;
  double allreduce_s = 0;
  double together_s = 0;
  double fraction = 0;  // 0 with fewer than two ranks
};
Result<OverlapCalibration> MeasureOverlap(const ModelSpec& spec,
                                          const OverlapCalibrationOptions& options);

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
