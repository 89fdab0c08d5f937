// CPU devices: slices of a host's cores that each act as one device (one worker process),
// so a 2-core box can host 2 devices. Built from a HostInfo (hal/host_probe.h) plus, where
// `kc topo probe` measured them, per-core bandwidth and FLOP/s figures
// (docs/design/measurement.md).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "hal/device.h"
#include "hal/host_probe.h"
#include "hal/topology.h"

namespace kc::hal {

// What was measured on this host; a field left 0 was not measured and stays 0 in what is
// produced from it. Bandwidths are bytes per second in one direction; latencies seconds.
struct CpuMeasurements {
  // Memory bandwidth one core drives, STREAM convention (bytes read + bytes written per
  // second of a copy, i.e. 2x MeasureStreamCopy's copy_bytes_per_second), the same
  // convention as a GPU's datasheet memory bandwidth. A slice gets this times its cores.
  double memory_bandwidth_per_core = 0;
  // FP32 FLOP/s of one core (sgemm); a slice gets this times its cores.
  double flops_fp32_per_core = 0;
  // Process-to-process shared-memory copy between two slices (MeasureSharedMemory): bytes
  // delivered per second, and one-way latency; not measured when shm_bandwidth is 0.
  double shm_bandwidth = 0;
  double shm_latency = 0;
};

struct CpuDeviceOptions {
  // `--cpu-devices N`: N slices with the host's cores split evenly, the remainder spread one
  // each over the first slices; a slice may then span NUMA nodes. 0: one slice per NUMA
  // node that has cores.
  int num_devices = 0;
  CpuMeasurements measured;
};

// The CPU devices of the host `info` describes, kind kCpu, ids "HOST/cpu0", "HOST/cpu1", ...
// in the order of the cores they hold (NUMA node order, then OS index). Each slice gets:
// model = info.cpu_model; cpus = the OS indices of its processing units; numa_node = the
// node holding most of them (the lowest on a tie); memory_bytes = each node's memory shared
// among the slices in proportion to the cores they hold on it (an even split when slices
// don't span nodes); memory_bandwidth and peak_flops_fp32 = the per-core measurements times
// its cores (0 when not measured); peak_flops_bf16 = 0: no native bf16 arithmetic is
// assumed on CPUs (bf16 work is widened to fp32 there).
// kInvalidArgument, naming "--cpu-devices", when num_devices is negative or larger than the
// host's cores (info.cores; the processing units counted in info.numa_nodes when 0), or when
// info lists no cores. Does no I/O.
Result<std::vector<DeviceDescriptor>> MakeCpuDevices(const HostInfo& info,
                                                     const CpuDeviceOptions& options);

// The HostSpec of this host: name = info.hostname; intra_host_default = shared memory with
// the conservative declared values of topology.h (kConservativeIntraHostBandwidth and
// ...Latency) and, when measured.shm_bandwidth > 0, measured.shm_bandwidth and
// measured.shm_latency as its measured values (which win, as a Link's do).
HostSpec MakeCpuHostSpec(const HostInfo& info, const CpuMeasurements& measured);

// A TopologySpec named after the host holding its CPU devices and its HostSpec, with no
// explicit links: every pair of slices reaches each other through the host's shared-memory
// default. (Slices of one host are symmetric for a process-to-process copy; listing n(n-1)/2
// identical links would add nothing. docs/design/measurement.md.) Errors as MakeCpuDevices.
// Topology::Build refuses zero FLOP/s and memory bandwidth, so fill options.measured first.
Result<TopologySpec> MakeCpuTopologySpec(const HostInfo& info, const CpuDeviceOptions& options);

}  // namespace kc::hal
