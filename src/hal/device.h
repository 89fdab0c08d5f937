// Device and link descriptors: the one language upper layers use for hardware (CPU slices,
// CUDA GPUs, simulated devices from an inventory). Plain values; the topology owns them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kc::hal {

enum class DeviceKind : uint8_t {
  kCpu,        // a slice of a host's cores
  kCuda,       // an NVIDIA GPU found through the CUDA runtime
  kSimulated,  // declared in an inventory file; nothing runs on it
};
std::string_view DeviceKindName(DeviceKind kind);  // "cpu", "cuda", "simulated"

// What carries bytes between two devices. Ordered fastest-class first only by convention;
// bandwidth, not kind, decides grouping.
enum class LinkKind : uint8_t {
  kSharedMemory,  // two CPU slices of one host: process-to-process copies through memory
  kNvlink,        // NVLink / NVSwitch
  kPcie,          // PCIe (through the host bridge)
  kNetwork,       // between hosts: Ethernet / InfiniBand through the host's NICs
};
std::string_view LinkKindName(LinkKind kind);  // "shm", "nvlink", "pcie", "network"
std::optional<LinkKind> LinkKindFromName(std::string_view name);

// Bandwidths are bytes per second in one direction; latencies are seconds.
struct DeviceDescriptor {
  std::string id;  // unique in a topology: "HOST/cpu0", "HOST/gpu3"
  DeviceKind kind = DeviceKind::kCpu;
  std::string model;  // "A100-SXM4-80GB", the CPU model for CPU slices
  std::string host;
  std::string rack;  // "" when not declared
  int index_on_host = 0;
  int numa_node = -1;     // -1: unknown
  std::vector<int> cpus;  // CPU slices: OS indices of the cores in the slice
  int64_t memory_bytes = 0;
  double peak_flops_fp32 = 0;  // FLOP/s
  double peak_flops_bf16 = 0;  // FLOP/s; 0 when the device has no bf16 arithmetic
  double memory_bandwidth = 0;
  // This device's share of its host's network, for traffic to other hosts.
  double network_bandwidth = 0;
  double network_latency = 0;
};

// A direct link between two devices of one host. Devices of different hosts talk over the
// network (see Topology), which is not listed link by link.
struct Link {
  int a = 0;  // device indices in the topology, a < b
  int b = 0;
  LinkKind kind = LinkKind::kPcie;
  double declared_bandwidth = 0;
  double declared_latency = 0;
  std::optional<double> measured_bandwidth;  // set by `kc topo probe`
  std::optional<double> measured_latency;

  // Measured where known, else declared.
  double bandwidth() const { return measured_bandwidth.value_or(declared_bandwidth); }
  double latency() const { return measured_latency.value_or(declared_latency); }
};

}  // namespace kc::hal
