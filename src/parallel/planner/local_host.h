// This machine as the planner's cluster: its CPU cores as devices, measured through L1, and
// the calibration that times the engine's own passes, all-reduce and overlap on them (`kc plan
// --calibrate`, `--cluster local`, `kc train --plan auto`). docs/design/planner-cost-model.md,
// "Calibration".
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "hal/host_probe.h"
#include "hal/topology.h"
#include "parallel/model_spec.h"
#include "parallel/planner/calibration.h"
#include "parallel/planner/cluster.h"

namespace kc::parallel::planner {

// kInvalidArgument when `devices` is more than four per core of the cores this process may use.
Status CheckLocalDevices(int devices, const hal::HostInfo& info);

// This host measured through L1 (memory, sgemm, shared memory; `quick`: shorter), its cores
// split into `devices` CPU devices: the topology, the planner's cluster of it, and the cores
// each device runs on. More devices than cores share them as kc train's ranks do (unpinned,
// one thread each): the topology has a device per core, the cluster the devices with their
// share of each figure and `oversubscription` = devices / cores.
struct MeasuredHost {
  hal::Topology topology;
  PlannerCluster cluster;
  std::vector<std::vector<int>> device_cpus;  // empty entries: unpinned
};
Result<MeasuredHost> MeasureLocalHost(const hal::HostInfo& info, int devices, bool quick);

// A calibration as the planner's cluster: this host's CPU slices, fp32, its measured constants;
// a note when it was measured with another model than `model`.
PlannerCluster FromCalibration(const Calibration& c, const std::string& model);

// This machine as `devices` CPU devices (0: one per core): the calibration file at
// `calibration_path` when there is one for that many devices, else a quick measurement
// through L1 (about a second) with the default cost-model constants. `source` says which.
struct LocalCluster {
  PlannerCluster cluster;
  std::string source;
};
Result<LocalCluster> ProbeLocalCluster(int devices, const std::string& model,
                                       const std::string& calibration_path);

struct HostCalibrationOptions {
  int devices = 0;                   // 0: one per core
  int64_t max_micro_batch_size = 8;  // the micro-batch sizes timed: 1, 2, 4, ... up to it (8)
  bool quick = false;                // shorter measurements, less accurate
  // Told what is being measured, before each part (for a progress line); may be empty.
  std::function<void(const std::string&)> progress;
};

// A calibration of this machine for `spec`, with what it measured on the way.
struct HostCalibration {
  Calibration calibration;
  int devices = 0;
  LinkCalibration links;
  OverlapCalibration overlap;
  double optimizer_seconds = 0;
  std::vector<std::string> notes;  // the measured cluster's (devices sharing cores)
};

// Measures this host (MeasureLocalHost), then the model's passes at every tensor-parallel size
// the devices allow and micro-batch size (MeasureCompute), the engine's all-reduce between the
// devices (MeasureLinks) and the gradient buckets' overlap (MeasureOverlap), and puts them
// together as a calibration file's contents. The caller keeps freed large blocks in the heap
// as kc train's workers do (mallopt), or the passes pay page faults training does not.
Result<HostCalibration> CalibrateHost(const ModelSpec& spec, const hal::HostInfo& info,
                                      const HostCalibrationOptions& options);

}  // namespace kc::parallel::planner
