// Run-time compiled kernels: what a machine without a GPU can check. Compiling to PTX needs
// only NVRTC (skipped where it is not installed); the CPU device compiles nothing. Kernels
// running on a GPU are tests/hal/cuda_kernels_gpu_test.cc (label gpu).
#include "hal/runtime_kernels.h"

#include <gtest/gtest.h>

#include "hal/cuda/cuda_device.h"

namespace kc::hal {
namespace {

// The PTX of `source`, or a skip when NVRTC is not on this machine.
#define KC_COMPILE_OR_SKIP(var, source)                         \
  Result<std::string> var = CompileToPtx(source, "compute_80"); \
  if (var.status().code() == ErrorCode::kNotFound) GTEST_SKIP() << var.status();

TEST(RuntimeKernelsTest, AKernelCompilesToPtx) {
  KC_COMPILE_OR_SKIP(
      ptx, (KernelSource{.name = "axpy", .code = R"(extern "C" __global__ void axpy(float* y,
                                                       float a, const float* x, int n) {
                                              int i = blockIdx.x * blockDim.x + threadIdx.x;
                                              if (i < n) y[i] += a * x[i];
                                            })"}));
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  EXPECT_NE(ptx->find(".entry axpy"), std::string::npos) << *ptx;
}

TEST(RuntimeKernelsTest, ASourceThatDoesNotCompileIsInvalidWithTheCompilersLog) {
  KC_COMPILE_OR_SKIP(ptx,
                     (KernelSource{.name = "broken",
                                   .code = "extern \"C\" __global__ void k() { undeclared(); }"}));
  EXPECT_EQ(ptx.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(ptx.status().message().find("undeclared"), std::string::npos) << ptx.status();
}

TEST(RuntimeKernelsTest, OptionsReachTheCompiler) {
  const KernelSource needs_define{
      .name = "defined",
      .code =
          "#ifndef KC_FLAG\n#error KC_FLAG not set\n#endif\nextern \"C\" __global__ void k() {}",
      .options = {"-DKC_FLAG=1"}};
  KC_COMPILE_OR_SKIP(ptx, needs_define);
  EXPECT_TRUE(ptx.ok()) << ptx.status();
  KernelSource without = needs_define;
  without.options.clear();
  EXPECT_EQ(CompileToPtx(without, "compute_80").status().code(), ErrorCode::kInvalidArgument);
}

TEST(RuntimeKernelsTest, OnlyVirtualArchitecturesGivePtx) {
  EXPECT_EQ(CompileToPtx({.name = "k", .code = ""}, "sm_80").status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(RuntimeKernelsTest, TheCudaBackendsElementwiseKernelsCompile) {
  KC_COMPILE_OR_SKIP(ptx, cuda::ElementwiseKernelSource());
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  for (const char* name : {"kc_reduce_bf16_sum", "kc_reduce_i64_max", "kc_axpy_f32",
                           "kc_convert_f32_bf16", "kc_fill_u16"}) {
    EXPECT_NE(ptx->find(std::string(".entry ") + name), std::string::npos) << name;
  }
}

TEST(RuntimeKernelsTest, TheCpuDeviceCompilesNothing) {
  DeviceDescriptor d{.id = "test/cpu", .kind = DeviceKind::kCpu};
  Result<std::unique_ptr<ComputeDevice>> cpu = OpenComputeDevice(d);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(CompileKernels(**cpu, {.name = "k", .code = ""}).status().code(),
            ErrorCode::kUnimplemented);
}

}  // namespace
}  // namespace kc::hal
