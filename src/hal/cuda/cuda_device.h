// The CUDA backend of ComputeDevice: an NVIDIA GPU through the driver API (memory, streams,
// copies, modules), cuBLAS for the products and NVRTC-compiled kernels for the element-wise
// ones, all loaded at run time (hal/cuda/cuda_api.h). docs/design/cuda-backend.md.
#pragma once

#include <memory>

#include "base/status.h"
#include "hal/compute.h"
#include "hal/device.h"
#include "hal/runtime_kernels.h"

namespace kc::hal::cuda {

// Opens the GPU `descriptor` names (kind kCuda; index_on_host is the CUDA ordinal, as the
// driver numbers the devices CUDA_VISIBLE_DEVICES leaves). Callers use hal::OpenComputeDevice,
// which lands here. Retains the device's primary context (the one the CUDA runtime and cuBLAS
// use) and compiles the element-wise kernels (a fraction of a second). kNotFound when the
// driver, NVRTC or cuBLAS cannot be loaded or the ordinal names no device; kUnavailable when
// the driver fails.
Result<std::unique_ptr<ComputeDevice>> OpenCudaDevice(const DeviceDescriptor& descriptor,
                                                      const ComputeDeviceOptions& options);

// The source of the element-wise kernels (hal/kernels.h) the device compiles when it opens:
// for tests that check it compiles on a machine without a GPU.
KernelSource ElementwiseKernelSource();

// The number of CUDA devices this process sees (those CUDA_VISIBLE_DEVICES leaves).
// kNotFound, saying why, when there is no driver or no device.
Result<int> CudaDeviceCount();

}  // namespace kc::hal::cuda
