#include "parallel/planner/cluster.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

namespace kc::parallel::planner {

CostModelOptions Fp32Options(CostModelOptions base) {
  base.activation_bytes = 4;
  base.param_bytes = 4;
  base.gradient_bytes = 4;
  base.optimizer_bytes = 8;
  // Read weight, gradient, m, v; write weight, m, v.
  base.optimizer_step_bytes = 28;
  return base;
}

Result<PlannerCluster> ClusterFromTopology(const hal::Topology& topology) {
  const int n = topology.num_devices();
  if (n == 0) {
    return InvalidArgumentError("planner: topology \"" + topology.name() + "\" has no devices");
  }
  PlannerCluster c;
  c.name = topology.name();
  c.device_model = topology.device(0).model;
  ClusterSpec& s = c.spec;
  s.devices = n;

  std::set<std::string> models;
  c.simulated = true;
  double bf16 = std::numeric_limits<double>::infinity();
  double fp32 = bf16, memory = bf16, memory_bw = bf16;
  for (int i = 0; i < n; ++i) {
    const hal::DeviceDescriptor& d = topology.device(i);
    models.insert(d.model);
    c.simulated = c.simulated && d.kind == hal::DeviceKind::kSimulated;
    bf16 = std::min(bf16, d.peak_flops_bf16);
    fp32 = std::min(fp32, d.peak_flops_fp32);
    memory = std::min(memory, static_cast<double>(d.memory_bytes));
    memory_bw = std::min(memory_bw, d.memory_bandwidth);
  }
  if (!c.simulated) {  // the engine runs on the real devices: the first one's kind
    for (int i = 0; i < n && s.device == hal::DeviceKind::kSimulated; ++i) {
      s.device = topology.device(i).kind;
    }
  }
  c.fp32 = bf16 <= 0;
  s.peak_flops = c.fp32 ? fp32 : bf16;
  s.memory_bytes = memory;
  s.memory_bandwidth = memory_bw;
  c.options = c.fp32 ? Fp32Options() : CostModelOptions{};
  // Transfers beside the compute on GPUs (declared or real); CPU ranks take turns.
  c.options.dp_overlap_fraction = s.device == hal::DeviceKind::kCpu ? 0 : kEngineDpOverlap;
  if (s.device == hal::DeviceKind::kCpu) {
    // The width term and its efficiency were fitted to GPUs' tensor cores, which need wide
    // matmuls; a CPU's BLAS is near its peak at far smaller ones (kc plan --calibrate measures
    // it).
    c.options.matmul_efficiency = kCpuMatmulEfficiency;
    c.options.efficiency_half_hidden = 0;
  }
  if (models.size() > 1) {
    c.device_model = fmt::format("mixed ({} models)", models.size());
    c.notes.push_back(
        fmt::format("{} device models; planned as if every device had the smallest figures of any",
                    models.size()));
  }

  // Devices per host, and the slowest path inside one.
  std::vector<std::vector<int>> by_host(topology.hosts().size());
  for (int i = 0; i < n; ++i) by_host[static_cast<size_t>(topology.host_of(i))].push_back(i);
  int smallest = n, largest = 0;
  double intra_bw = std::numeric_limits<double>::infinity(), intra_lat = 0;
  std::vector<int> first_of_host;
  std::set<std::pair<double, double>> host_links;  // each host's (slowest, fastest) path
  for (const std::vector<int>& devices : by_host) {
    if (devices.empty()) continue;
    first_of_host.push_back(devices.front());
    smallest = std::min(smallest, static_cast<int>(devices.size()));
    largest = std::max(largest, static_cast<int>(devices.size()));
    double slowest = std::numeric_limits<double>::infinity(), fastest = 0;
    for (size_t a = 0; a < devices.size(); ++a) {
      for (size_t b = a + 1; b < devices.size(); ++b) {
        const hal::PathCost path = topology.Path(devices[a], devices[b]);
        intra_bw = std::min(intra_bw, path.bandwidth);
        intra_lat = std::max(intra_lat, path.latency);
        slowest = std::min(slowest, path.bandwidth);
        fastest = std::max(fastest, path.bandwidth);
      }
    }
    if (devices.size() > 1) host_links.insert({slowest, fastest});
  }
  c.mixed = models.size() > 1 || smallest != largest || host_links.size() > 1 ||
            (!host_links.empty() && host_links.begin()->first != host_links.begin()->second);
  s.devices_per_node = smallest;
  if (smallest != largest) {
    c.notes.push_back(
        fmt::format("hosts hold {} to {} devices; tensor parallelism is kept within {}", smallest,
                    largest, smallest));
  }
  if (largest < 2) {  // no two devices share a host: the intra-node figures are never used
    intra_bw = memory_bw;
    intra_lat = 0;
  }
  s.intra_node_bandwidth = intra_bw;
  s.intra_node_latency = intra_lat;

  // Between hosts: the slowest path from the first host to any other (every path across the
  // spine when racks differ; hosts of one rack see one another alike).
  if (first_of_host.size() > 1) {
    double inter_bw = std::numeric_limits<double>::infinity(), inter_lat = 0;
    bool crosses_rack = false;
    for (size_t h = 1; h < first_of_host.size(); ++h) {
      const hal::PathCost path = topology.Path(first_of_host[0], first_of_host[h]);
      inter_bw = std::min(inter_bw, path.bandwidth);
      inter_lat = std::max(inter_lat, path.latency);
      crosses_rack = crosses_rack || path.crosses_rack;
    }
    s.inter_node_bandwidth = inter_bw;
    s.inter_node_latency = inter_lat;
    const hal::NetworkSpec& net = topology.network();
    if (crosses_rack && (net.cross_rack_bandwidth_factor < 1 || net.cross_rack_latency > 0)) {
      c.notes.push_back(
          fmt::format("hosts in several racks: every inter-node link is planned at the cross-rack "
                      "{:.1f} GB/s",
                      inter_bw / 1e9));
    }
  } else {
    s.inter_node_bandwidth = s.intra_node_bandwidth;
    s.inter_node_latency = s.intra_node_latency;
  }
  return c;
}

}  // namespace kc::parallel::planner
