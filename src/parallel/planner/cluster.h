// The cluster as the cost model sees it, from L1's topology: a probed host (`kc topo probe`)
// or a simulated inventory. And the engine's numerics on it: mixed precision (bf16 compute,
// fp32 master weights) where the devices have bf16 arithmetic, fp32 throughout where they
// do not (CPU slices). docs/design/planner-cost-model.md.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"
#include "parallel/planner/cost_model.h"

namespace kc::parallel::planner {

struct PlannerCluster {
  ClusterSpec spec;
  CostModelOptions options;  // the defaults with the precision's byte counts
  std::string name;          // the topology's
  std::string device_model;  // the devices' model; "mixed (N models)" when they differ
  bool fp32 = false;         // no bf16 arithmetic on some device: the engine trains in fp32
  bool simulated = false;    // every device is declared only (kind simulated): nothing runs here
  // Devices of several models, hosts of several sizes, or hosts whose devices are joined by
  // links of different speeds: SearchOnDevices (hetero.h) prices plans on their own devices.
  bool mixed = false;
  // What the homogeneous model had to approximate: mixed device models, hosts of different
  // sizes, racks behind an oversubscribed spine. Empty when the topology is uniform.
  std::vector<std::string> notes;
};

// Reduces `topology` to a homogeneous ClusterSpec, the weakest figure winning where devices
// differ: device = kSimulated when every device is declared only, else the first real
// device's kind; peak = bf16 FLOP/s (fp32 when any device lacks bf16), memory and memory
// bandwidth the smallest, devices_per_node the smallest host, intra-node bandwidth the slowest path
// between two devices of one host (latency the largest), inter-node the slowest path between
// two hosts (across racks when there are several). kInvalidArgument for a topology with no
// devices.
Result<PlannerCluster> ClusterFromTopology(const hal::Topology& topology);

// The cost model's byte counts for an engine that trains in fp32: 4-byte activations,
// weights and gradients, the AdamW moments as the only optimizer state (8 bytes; the weights
// are the master copy), and 28 bytes streamed per parameter by the optimizer step.
CostModelOptions Fp32Options(CostModelOptions base = {});

}  // namespace kc::parallel::planner
