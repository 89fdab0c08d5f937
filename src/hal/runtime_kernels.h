// Device kernels compiled at run time: CUDA C++ source, compiled by NVRTC for the device it
// will run on, loaded, and launched on a Stream. The layers above bring their own kernels this
// way (the L3 engine's model kernels, docs/design/kernels.md) without CUDA ever being a build
// dependency. The CPU backend compiles nothing: CompileKernels returns kUnimplemented there.
//
//   KC_ASSIGN_OR_RETURN(auto module, hal::CompileKernels(device, {.name = "gpt", .code = src}));
//   KC_ASSIGN_OR_RETURN(hal::KernelFunction fn, module->Function("layernorm_forward"));
//   KC_RETURN_IF_ERROR(hal::Launch(stream, fn, {.grid_x = rows, .block_x = 256}, out, inp, n));
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "hal/compute.h"

namespace kc::hal {

// The source of one module. The code may not #include anything (NVRTC finds no system
// headers here): it declares what it needs, and its kernels are extern "C" so that their
// names are not mangled.
struct KernelSource {
  std::string name;                  // for errors and logs, e.g. "gpt_kernels"
  std::string code;                  // CUDA C++
  std::vector<std::string> options;  // more NVRTC options, e.g. "-DKC_BF16=1"
};

class KernelModule;

// Device code a kernel source may start with (prepend it: KernelPrelude() + code): `u64`, the
// bf16 type `bf16_t` (its bits, as unsigned short) with `bf2f` (exact) and `f2bf` (round to
// nearest even, NaN kept quiet: FloatToBf16's rule), and GRID_STRIDE(i, n), a grid-stride loop
// over n elements.
std::string_view KernelPrelude();

// One __global__ function of a loaded module: a plain value, valid while its module is.
struct KernelFunction {
  void* handle = nullptr;                // the backend's (a CUfunction)
  const KernelModule* module = nullptr;  // not owned
  std::string name;
};

// Compiled code loaded on one device. Function lookups are safe for concurrent use; the
// module must outlive every launch of its functions that has not finished.
class KernelModule {
 public:
  virtual ~KernelModule() = default;
  KernelModule(const KernelModule&) = delete;
  KernelModule& operator=(const KernelModule&) = delete;

  ComputeDevice& device() const { return *device_; }
  // The extern "C" __global__ function `name`; kNotFound when the module has none.
  virtual Result<KernelFunction> Function(std::string_view name) const = 0;

 protected:
  explicit KernelModule(ComputeDevice* device) : device_(device) {}

 private:
  ComputeDevice* const device_;  // outlives the module (it owns the code's memory)
};

// Compiles `source` for `device` (its own architecture, or the newest NVRTC knows when the
// device is newer: the driver then compiles the PTX) and loads it. Takes a fraction of a
// second per module: compile once, at setup. kInvalidArgument with the compiler's log when
// the source does not compile; kNotFound when NVRTC cannot be loaded; kUnimplemented on a
// device that compiles nothing (CPU).
Result<std::unique_ptr<KernelModule>> CompileKernels(ComputeDevice& device,
                                                     const KernelSource& source);

// Compiles `source` to PTX for the virtual architecture `arch` ("compute_80") without any
// device: how tests on a machine without a GPU check that every kernel source compiles.
// kNotFound when NVRTC cannot be loaded; kInvalidArgument with the log when it does not compile
// (also for an architecture NVRTC does not know).
Result<std::string> CompileToPtx(const KernelSource& source, std::string_view arch);

// Grid and block of one launch, and the dynamic shared memory each block gets.
struct LaunchShape {
  uint32_t grid_x = 1;
  uint32_t grid_y = 1;
  uint32_t grid_z = 1;
  uint32_t block_x = 1;
  uint32_t block_y = 1;
  uint32_t block_z = 1;
  uint32_t shared_bytes = 0;
};

// Enqueues fn on `stream`: args[i] points at the value of the kernel's i-th parameter, of
// exactly the type the kernel declares (a device pointer, an int, a float ...). Returns once
// queued. kInvalidArgument when fn's module is of another device than the stream's, a
// dimension is 0, or the block has more than 1024 threads; launch and execution errors come
// back from Synchronize.
Status LaunchKernel(Stream& stream, const KernelFunction& fn, const LaunchShape& shape,
                    std::span<void* const> args);

// LaunchKernel with the arguments as values: Launch(s, fn, shape, out_ptr, in_ptr, n).
template <typename... Args>
Status Launch(Stream& stream, const KernelFunction& fn, const LaunchShape& shape,
              const Args&... args) {
  void* pointers[sizeof...(Args) + 1] = {const_cast<void*>(static_cast<const void*>(&args))...,
                                         nullptr};
  return LaunchKernel(stream, fn, shape, std::span<void* const>(pointers, sizeof...(Args)));
}

}  // namespace kc::hal
