// The GPT's layers as CUDA kernels, compiled at run time for the device (hal/runtime_kernels.h):
// the same functions as parallel/gpt_kernels.h, which is their reference (each is tested
// against it), over device memory. Products are not here: the model calls hal::Gemm.
//
// Activations ("act" below) are fp32 or bf16 as the precision says, passed as void* since
// their type is the precision's; statistics (LayerNorm means and reciprocal deviations, the
// losses), parameters and parameter gradients are always fp32. Every call enqueues on its
// stream and returns; arguments are trusted (the model checks shapes once; a bad launch
// surfaces at Synchronize). Dimensions must fit in int32 (the model checks).
//
// Conventions as gpt_kernels.h: N = rows (B*T tokens), C = width, OC = output width, NH =
// heads, hd = C / NH, V = vocabulary. Parameter gradients are always ADDED to (the model
// zeroes them at the start of a step), so that micro-batches add up.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "base/status.h"
#include "hal/compute.h"
#include "hal/runtime_kernels.h"
#include "parallel/precision.h"

namespace kc::parallel {

// The arguments of one AdamW update over a whole parameter arena (torch.optim.AdamW, as
// parallel/optimizer.h): p *= keep (decayed tensors); m, v updated from grad * grad_scale;
// p -= step_size * m / (sqrt(v) * inv_sqrt_c2 + eps). `bounds` (tensors + 1 offsets, device
// memory) cut the arena into tensors and `decay` (tensors flags) says which are decayed.
struct CudaAdamWArgs {
  float* params = nullptr;          // (n) fp32 master weights
  void* params_act = nullptr;       // (n) their bf16 copy, rewritten; null in fp32
  const float* grads = nullptr;     // (n)
  float* m = nullptr;               // (n)
  float* v = nullptr;               // (n)
  const int64_t* bounds = nullptr;  // (tensors + 1)
  const uint8_t* decay = nullptr;   // (tensors)
  int tensors = 0;
  int64_t n = 0;
  float beta1 = 0, beta2 = 0, eps = 0;
  float step_size = 0;    // lr / (1 - beta1^t)
  float inv_sqrt_c2 = 0;  // 1 / sqrt(1 - beta2^t)
  float grad_scale = 1;   // ClipScale
  float keep = 1;         // 1 - lr * weight_decay, for decayed tensors
};

// Not thread-safe: one training thread enqueues (launches on different streams from
// different threads would be safe, but nothing does that).
class CudaGptKernels {
 public:
  // Compiles the kernels for `device` (not owned; must outlive this) with activations of
  // `precision`. kUnimplemented on a device that runs no run-time compiled kernels (CPU).
  static Result<std::unique_ptr<CudaGptKernels>> Create(hal::ComputeDevice* device,
                                                        Precision precision);
  // The source compiled (for tests that check it compiles without a GPU).
  static hal::KernelSource Source(Precision precision);

  Precision precision() const { return precision_; }
  hal::DataType act_type() const {
    return precision_ == Precision::kBf16 ? hal::DataType::kBf16 : hal::DataType::kF32;
  }
  size_t act_bytes() const { return precision_ == Precision::kBf16 ? 2 : 4; }

  // out (B*T, C) = wte[inp] + wpe[t]. wte (V, C), wpe (T, C), inp (B, T).
  Status EncoderForward(hal::Stream& s, void* out, const int32_t* inp, const float* wte,
                        const float* wpe, int64_t B, int64_t T, int64_t C);
  // dwte[inp[b, t]] += dout[b, t]; dwpe[t] += dout[b, t].
  Status EncoderBackward(hal::Stream& s, float* dwte, float* dwpe, const void* dout,
                         const int32_t* inp, int64_t B, int64_t T, int64_t C);
  // out (N, C) = (inp - mean) * rstd * weight + bias; mean, rstd (N).
  Status LayerNormForward(hal::Stream& s, void* out, float* mean, float* rstd, const void* inp,
                          const float* weight, const float* bias, int64_t N, int64_t C, float eps);
  // dinp (N, C) = (overwrite ? 0 : dinp) + the input gradient; dweight, dbias (C) added to.
  Status LayerNormBackward(hal::Stream& s, void* dinp, float* dweight, float* dbias,
                           const void* dout, const void* inp, const float* weight,
                           const float* mean, const float* rstd, int64_t N, int64_t C,
                           bool overwrite);
  // out (N, OC) += bias (OC) per row.
  Status AddBias(hal::Stream& s, void* out, const float* bias, int64_t N, int64_t OC);
  // dbias (OC) += the column sums of dout (N, OC).
  Status BiasBackward(hal::Stream& s, float* dbias, const void* dout, int64_t N, int64_t OC);
  // out = a + b over n elements (out may be a or b).
  Status Residual(hal::Stream& s, void* out, const void* a, const void* b, int64_t n);
  Status GeluForward(hal::Stream& s, void* out, const void* inp, int64_t n);
  // dinp = gelu'(inp) * dout; dinp may be dout.
  Status GeluBackward(hal::Stream& s, void* dinp, const void* inp, const void* dout, int64_t n);
  // Heads apart and back together: out (B, NH, T, hd) = the columns [offset + h*hd, ...) of the
  // rows (B, T) of width ld in `in`, and MergeHeads the reverse (writing only those columns).
  Status SplitHeads(hal::Stream& s, void* out, const void* in, int64_t B, int64_t T, int64_t NH,
                    int64_t hd, int64_t ld, int64_t offset);
  Status MergeHeads(hal::Stream& s, void* out, const void* in, int64_t B, int64_t T, int64_t NH,
                    int64_t hd, int64_t ld, int64_t offset);
  // In place over rows of T scores (row r is position r % T of its sequence): the causal
  // softmax, zero above the diagonal.
  Status SoftmaxCausalForward(hal::Stream& s, void* att, int64_t rows, int64_t T);
  // In place: datt = att * (datt - sum_j att * datt), causal (zero above the diagonal).
  Status SoftmaxCausalBackward(hal::Stream& s, void* datt, const void* att, int64_t rows,
                               int64_t T);
  // Cross-entropy of logits (N, V; rows ldv apart) against targets (N): losses (N); with
  // grad_scale != 0 the logits are OVERWRITTEN with grad_scale * (softmax - onehot).
  Status CrossEntropy(hal::Stream& s, void* logits, float* losses, const int32_t* targets,
                      int64_t N, int64_t V, int64_t ldv, float grad_scale);
  // partials[i] = the sum of squares of a strided share of x (n); `blocks` of them.
  Status SquaredSumPartials(hal::Stream& s, float* partials, int64_t blocks, const float* x,
                            int64_t n);
  Status AdamW(hal::Stream& s, const CudaAdamWArgs& args);

 private:
  CudaGptKernels(Precision precision, std::unique_ptr<hal::KernelModule> module)
      : precision_(precision), module_(std::move(module)) {}
  Result<hal::KernelFunction> Get(const char* name);
  template <typename... Args>
  Status Run(hal::Stream& s, const char* name, const hal::LaunchShape& shape, const Args&... args);
  // SplitHeads (kernel gpt_split_heads) or MergeHeads (gpt_merge_heads).
  Status Heads(hal::Stream& s, const char* kernel, void* out, const void* in, int64_t B, int64_t T,
               int64_t NH, int64_t hd, int64_t ld, int64_t offset);
  // Grid-stride launch over n elements.
  template <typename... Args>
  Status RunElementwise(hal::Stream& s, const char* name, int64_t n, const Args&... args);

  const Precision precision_;
  const std::unique_ptr<hal::KernelModule> module_;
  std::unordered_map<std::string, hal::KernelFunction> functions_;
};

}  // namespace kc::parallel
