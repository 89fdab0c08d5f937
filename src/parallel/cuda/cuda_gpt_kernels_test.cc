// What a machine without a GPU can check of the CUDA engine: its kernels compile (NVRTC alone,
// skipped where it is not installed) and a CPU device refuses it. The kernels against their
// CPU references, and the model against the CPU engine, run on a GPU:
// tests/parallel/cuda_gpt_gpu_test.cc (label gpu).
#include "parallel/cuda/cuda_gpt_kernels.h"

#include <gtest/gtest.h>

#include "hal/compute.h"
#include "hal/runtime_kernels.h"
#include "parallel/cuda/cuda_gpt.h"

namespace kc::parallel {
namespace {

class CudaGptKernelsSourceTest : public ::testing::TestWithParam<Precision> {};

TEST_P(CudaGptKernelsSourceTest, CompilesWithEveryKernelTheEngineLaunches) {
  Result<std::string> ptx = hal::CompileToPtx(CudaGptKernels::Source(GetParam()), "compute_80");
  if (ptx.status().code() == ErrorCode::kNotFound) GTEST_SKIP() << ptx.status();
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  for (const char* name :
       {"gpt_encoder_forward", "gpt_encoder_backward", "gpt_layernorm_forward",
        "gpt_layernorm_backward", "gpt_layernorm_param_backward", "gpt_column_sum", "gpt_add_bias",
        "gpt_residual_forward", "gpt_gelu_forward", "gpt_gelu_backward", "gpt_split_heads",
        "gpt_merge_heads", "gpt_softmax_causal_forward", "gpt_softmax_causal_backward",
        "gpt_crossentropy", "gpt_squared_sum", "gpt_adamw"}) {
    EXPECT_NE(ptx->find(std::string(".entry ") + name), std::string::npos) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGptKernelsSourceTest,
                         ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(PrecisionName(info.param));
                         });

TEST(CudaGptTest, ACpuDeviceRunsNoCudaModel) {
  hal::DeviceDescriptor d{.id = "test/cpu", .kind = hal::DeviceKind::kCpu};
  Result<std::unique_ptr<hal::ComputeDevice>> cpu = hal::OpenComputeDevice(d);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ModelSpec spec;
  spec.name = "tiny";
  spec.layers = 1;
  spec.hidden = 8;
  spec.heads = 2;
  spec.ffn_hidden = 12;
  spec.vocab = 11;
  spec.seq_len = 4;
  spec.batch_per_rank = 2;
  EXPECT_EQ(CudaGpt::Create(spec, cpu->get(), {}).status().code(), ErrorCode::kUnimplemented);
}

TEST(PrecisionTest, ParsesItsNamesAndRefusesOthers) {
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    Result<Precision> parsed = ParsePrecision(PrecisionName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(ParsePrecision("fp16").status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kc::parallel
