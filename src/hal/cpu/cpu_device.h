// The CPU backend of ComputeDevice: a slice of this host's cores, memory bound to its NUMA
// node through hwloc, sgemm through OpenBLAS, element-wise kernels as plain loops.
#pragma once

#include <memory>

#include "base/status.h"
#include "hal/compute.h"
#include "hal/device.h"

namespace kc::hal::cpu {

// Opens the CPU slice `descriptor` names (kind kCpu). Callers use hal::OpenComputeDevice,
// which lands here. kInvalidArgument when a cpu of the slice is not one this process may use,
// the NUMA node is not on this host, or options.threads < 0; kUnavailable when hwloc cannot
// read the topology. Sets OpenBLAS's process-wide thread count to the device's threads.
Result<std::unique_ptr<ComputeDevice>> OpenCpuDevice(const DeviceDescriptor& descriptor,
                                                     const ComputeDeviceOptions& options);

}  // namespace kc::hal::cpu
