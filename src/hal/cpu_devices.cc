#include "hal/cpu_devices.h"

#include <algorithm>
#include <map>
#include <utility>

#include "base/layer_guard.h"

namespace kc::hal {
namespace {

// One processing unit with the index (in info.numa_nodes) of the node holding it.
struct Pu {
  int cpu;
  size_t node;
};

// The slices as lists of PUs, in node order then OS index order.
Result<std::vector<std::vector<Pu>>> SplitCores(const HostInfo& info, int num_devices) {
  std::vector<Pu> pus;
  std::vector<std::vector<Pu>> slices;
  for (size_t n = 0; n < info.numa_nodes.size(); ++n) {
    std::vector<int> cpus = info.numa_nodes[n].cpus;
    std::sort(cpus.begin(), cpus.end());
    if (num_devices == 0 && !cpus.empty()) slices.emplace_back();
    for (int cpu : cpus) {
      pus.push_back({cpu, n});
      if (num_devices == 0) slices.back().push_back({cpu, n});
    }
  }
  if (pus.empty()) {
    return InvalidArgumentError("--cpu-devices: the host lists no cores in its NUMA nodes");
  }
  if (num_devices == 0) return slices;
  const int cores = info.cores > 0 ? info.cores : static_cast<int>(pus.size());
  if (num_devices < 0 || num_devices > cores) {
    return InvalidArgumentError("--cpu-devices=" + std::to_string(num_devices) +
                                ": expected 0 (one per NUMA node) to " + std::to_string(cores) +
                                ", the cores of host " + info.hostname);
  }
  // Even split; the first `extra` slices get one PU more.
  const size_t base = pus.size() / num_devices;
  const size_t extra = pus.size() % num_devices;
  size_t next = 0;
  for (int i = 0; i < num_devices; ++i) {
    const size_t take = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    slices.emplace_back(pus.begin() + next, pus.begin() + next + take);
    next += take;
  }
  return slices;
}

}  // namespace

Result<std::vector<DeviceDescriptor>> MakeCpuDevices(const HostInfo& info,
                                                     const CpuDeviceOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "cpu_devices");
  KC_ASSIGN_OR_RETURN(std::vector<std::vector<Pu>> slices, SplitCores(info, options.num_devices));
  std::vector<DeviceDescriptor> devices;
  devices.reserve(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    const std::vector<Pu>& slice = slices[i];
    DeviceDescriptor d;
    d.id = info.hostname + "/cpu" + std::to_string(i);
    d.kind = DeviceKind::kCpu;
    d.model = info.cpu_model;
    d.host = info.hostname;
    d.index_on_host = static_cast<int>(i);
    std::map<size_t, int64_t> per_node;  // node -> PUs of this slice on it
    for (const Pu& pu : slice) {
      d.cpus.push_back(pu.cpu);
      ++per_node[pu.node];
    }
    size_t home = per_node.begin()->first;
    for (const auto& [node, count] : per_node) {
      if (count > per_node[home]) home = node;
      const NumaNode& n = info.numa_nodes[node];
      const auto node_pus = static_cast<int64_t>(n.cpus.size());
      // memory * count / node_pus without overflow.
      d.memory_bytes +=
          n.memory_bytes / node_pus * count + n.memory_bytes % node_pus * count / node_pus;
    }
    d.numa_node = info.numa_nodes[home].os_index;
    const auto cores = static_cast<double>(slice.size());
    d.memory_bandwidth = options.measured.memory_bandwidth_per_core * cores;
    d.peak_flops_fp32 = options.measured.flops_fp32_per_core * cores;
    d.peak_flops_bf16 = 0;
    devices.push_back(std::move(d));
  }
  return devices;
}

HostSpec MakeCpuHostSpec(const HostInfo& info, const CpuMeasurements& measured) {
  IntraHostDefault shm{.kind = LinkKind::kSharedMemory,
                       .bandwidth = kConservativeIntraHostBandwidth,
                       .latency = kConservativeIntraHostLatency,
                       .measured_bandwidth = std::nullopt,
                       .measured_latency = std::nullopt};
  if (measured.shm_bandwidth > 0) {
    shm.measured_bandwidth = measured.shm_bandwidth;
    shm.measured_latency = measured.shm_latency;
  }
  return HostSpec{.name = info.hostname, .rack = "", .intra_host_default = shm};
}

Result<TopologySpec> MakeCpuTopologySpec(const HostInfo& info, const CpuDeviceOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "cpu_devices");
  TopologySpec spec;
  spec.name = info.hostname;
  KC_ASSIGN_OR_RETURN(spec.devices, MakeCpuDevices(info, options));
  spec.hosts.push_back(MakeCpuHostSpec(info, options.measured));
  return spec;
}

}  // namespace kc::hal
