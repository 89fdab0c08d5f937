#include "hal/runtime_kernels.h"

#include "base/layer_guard.h"
#include "hal/cuda/nvrtc.h"
#include "hal/internal/kernel_backend.h"

namespace kc::hal {

std::string_view KernelPrelude() {
  return R"CUDA(
typedef unsigned long long u64;
typedef unsigned short bf16_t;
__device__ __forceinline__ float bf2f(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}
#define GRID_STRIDE(i, n) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)
)CUDA";
}

Result<std::unique_ptr<KernelModule>> CompileKernels(ComputeDevice& device,
                                                     const KernelSource& source) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  return device.backend().Compile(source);
}

Result<std::string> CompileToPtx(const KernelSource& source, std::string_view arch) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  if (!arch.starts_with("compute_")) {
    return InvalidArgumentError("compile " + source.name + ": architecture " + std::string(arch) +
                                " is not a virtual one (compute_XY)");
  }
  return cuda::Compile(source, {.arch = std::string(arch), .cubin = false});
}

Status LaunchKernel(Stream& stream, const KernelFunction& fn, const LaunchShape& shape,
                    std::span<void* const> args) {
  KC_LAYER_ENTRY(Layer::kHal, "kernels");
  if (fn.module == nullptr || fn.handle == nullptr) {
    return InvalidArgumentError("launch: an empty KernelFunction");
  }
  if (&fn.module->device() != &stream.device()) {
    return InvalidArgumentError("launch " + fn.name + ": the kernel is loaded on device " +
                                fn.module->device().descriptor().id + ", the stream is of " +
                                stream.device().descriptor().id);
  }
  if (shape.grid_x == 0 || shape.grid_y == 0 || shape.grid_z == 0 || shape.block_x == 0 ||
      shape.block_y == 0 || shape.block_z == 0) {
    return InvalidArgumentError("launch " + fn.name + ": a grid or block dimension is 0");
  }
  if (static_cast<uint64_t>(shape.block_x) * shape.block_y * shape.block_z > 1024) {
    return InvalidArgumentError("launch " + fn.name + ": more than 1024 threads in a block");
  }
  return stream.device().backend().Launch(stream, fn, shape, args);
}

}  // namespace kc::hal
