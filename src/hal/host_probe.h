// Probes this host's CPUs, caches, NUMA nodes and memory through hwloc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace kc::hal {

struct CacheLevel {
  int level = 0;           // 1, 2, 3
  int64_t size_bytes = 0;  // one instance
  int count = 0;           // instances on the host
};

struct NumaNode {
  int os_index = 0;
  int64_t memory_bytes = 0;
  std::vector<int> cpus;  // OS indices of the processing units local to the node
};

// What the probe found. A plain value.
struct HostInfo {
  std::string hostname;
  std::string cpu_model;     // "" when the OS does not say
  int packages = 0;          // sockets
  int cores = 0;             // physical cores
  int pus = 0;               // processing units (hardware threads)
  int64_t memory_bytes = 0;  // total, as the kernel counts it
  std::vector<NumaNode> numa_nodes;
  std::vector<CacheLevel> caches;  // innermost first
};

// Reads the topology of the cores this process may use (the cgroup's cpuset).
// Returns kUnavailable when hwloc cannot load the topology. Takes milliseconds.
Result<HostInfo> ProbeHost();

}  // namespace kc::hal
