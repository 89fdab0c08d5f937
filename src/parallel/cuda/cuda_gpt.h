// The GPT of a ModelSpec on a CUDA device: parallel/gpt_model.h's model (the same parameters
// in the same arena order, the same initialisation, the same function), run by the kernels of
// cuda_gpt_kernels.h and hal::Gemm's cuBLAS products, with AdamW on the device too, so that a
// training step moves nothing but the batch in and the loss out. The whole model on one
// device: no tensor or pipeline parallelism (the trainer all-reduces its gradients for data
// parallelism).
//
// Precision::kFp32 runs everything in fp32 (products without TF32), so its losses match the
// CPU engine's within fp32 rounding. Precision::kBf16 is mixed precision: activations and the
// products' operands in bf16 (a bf16 copy of the weights, rewritten by every AdamW step), fp32
// accumulation, and fp32 master weights, parameter gradients, LayerNorm statistics, losses and
// optimizer moments.
//
//   KC_ASSIGN_OR_RETURN(auto model, CudaGpt::Create(spec, device, {.precision = kBf16}));
//   KC_RETURN_IF_ERROR(model->InitParameters(spec.training.seed));
//   KC_RETURN_IF_ERROR(model->ZeroGradients());
//   KC_ASSIGN_OR_RETURN(double loss, model->Forward(inputs, targets, 1.0 / model->tokens()));
//   KC_RETURN_IF_ERROR(model->Backward());
//
// Not thread-safe: one training thread drives it. Everything runs on the device's default
// stream, in order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "hal/compute.h"
#include "parallel/cuda/cuda_gpt_kernels.h"
#include "parallel/model_spec.h"
#include "parallel/precision.h"

namespace kc::parallel {

class CudaGpt {
 public:
  struct Options {
    int64_t batch = 0;  // sequences per forward; 0: spec.batch_per_rank
    Precision precision = Precision::kFp32;
    // How long one synchronisation with the device may take before kDeadlineExceeded.
    Duration timeout = std::chrono::minutes(10);
  };

  // Checks the spec (ValidateModelSpec), compiles the kernels and allocates everything on
  // `device` (not owned; must outlive the model), so nothing is allocated after this.
  // Parameters start as zeros. kInvalidArgument for a bad spec or batch; kUnimplemented on a
  // device without run-time compiled kernels (CPU); kResourceExhausted when it does not fit.
  static Result<std::unique_ptr<CudaGpt>> Create(const ModelSpec& spec, hal::ComputeDevice* device,
                                                 const Options& options);
  ~CudaGpt();

  const ModelSpec& spec() const { return spec_; }
  int64_t batch() const { return batch_; }
  int64_t tokens() const { return batch_ * spec_.seq_len; }  // per forward: B * T
  Precision precision() const { return kernels_->precision(); }
  // ParameterTensors(spec): the arena's tensors, in order.
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  int64_t num_parameters() const { return num_parameters_; }
  // Device memory this model holds (the optimizer's is its own).
  int64_t arena_bytes() const { return arena_bytes_; }
  int64_t activation_bytes() const { return activation_bytes_; }
  hal::ComputeDevice& device() const { return *device_; }
  hal::Stream& stream() const { return device_->default_stream(); }
  CudaGptKernels& kernels() { return *kernels_; }

  // The fp32 master weights and their gradients, the whole arena (device memory).
  hal::DeviceSpan<float> params() const { return params_; }
  hal::DeviceSpan<float> grads() const { return grads_; }
  // The bf16 copy of the weights the products read; empty in fp32 (they read params()).
  hal::DeviceSpan<hal::Bf16> compute_params() const { return params_bf16_; }

  // InitParameterTensor of every tensor, uploaded. Synchronous.
  Status InitParameters(uint64_t seed);
  // Every parameter, in arena order (num_parameters values): upload (refreshing the bf16
  // copy) and download. Synchronous. kInvalidArgument for a wrong size.
  Status SetParameters(std::span<const float> values);
  Status GetParameters(std::span<float> values);
  // Rewrites the bf16 copy from params() (after they changed other than through AdamW).
  Status RefreshComputeCopy();

  // Gpt::Forward's contract: the mean cross-entropy of inputs (B, T) against targets (B, T);
  // with grad_scale != 0 the logits' gradient is left for Backward. Waits for the device to
  // return the loss. kInvalidArgument for a token outside [0, vocab) or wrong sizes;
  // kDeadlineExceeded or the device's error when it fails.
  Result<double> Forward(std::span<const int32_t> inputs, std::span<const int32_t> targets,
                         double grad_scale);
  // Adds the gradient of grad_scale * (the last training Forward's token losses) to grads().
  // Enqueued, not waited for. kFailedPrecondition when the last Forward was not a training one.
  Status Backward();
  // grads() = 0. Enqueued.
  Status ZeroGradients();
  // The sum of the squares of grads(), accumulated in fp32 per share and in double over them.
  // Waits for the device.
  Result<double> GradSquaredNorm();
  // Waits for everything enqueued.
  Status Synchronize();

 private:
  CudaGpt(ModelSpec spec, int64_t batch, hal::ComputeDevice* device, Duration timeout)
      : spec_(std::move(spec)), batch_(batch), device_(device), timeout_(timeout) {}
  Status Allocate();
  Status LayerForward(int64_t l);
  Status LayerBackward(int64_t l);
  // hal::Gemm on this device: row-major C (M, N) = alpha op(A) op(B) + beta C, over `batch`
  // matrices `stride_*` elements apart; A and B of the activation type, C of `c_type`.
  Status Mm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
            int64_t lda, const void* b, int64_t ldb, float beta, void* c, hal::DataType c_type,
            int64_t ldc, int64_t batch = 1, int64_t stride_a = 0, int64_t stride_b = 0,
            int64_t stride_c = 0);
  // Tensor i's master weights and gradient (fp32), and the copy products read (act type).
  float* P(int i) const { return params_.data() + tensors_[static_cast<size_t>(i)].offset; }
  float* G(int i) const { return grads_.data() + tensors_[static_cast<size_t>(i)].offset; }
  const void* W(int i) const;

  // Per-layer tensor indices, as Gpt's (ParameterTensors order).
  enum LayerTensor {
    kLn1W = 0,
    kLn1B,
    kQkvW,
    kQkvB,
    kProjW,
    kProjB,
    kLn2W,
    kLn2B,
    kFcW,
    kFcB,
    kFcProjW,
    kFcProjB,
    kTensorsPerLayer
  };
  int LayerIndex(int64_t l, LayerTensor t) const {
    return 2 + static_cast<int>(l) * kTensorsPerLayer + t;
  }

  // What one layer's forward keeps for its backward ("act": the activation type). The layer's
  // input is resid_[l], its output resid_[l + 1].
  struct LayerActs {
    void* ln1;        // (BT, C)
    float* ln1_mean;  // (BT)
    float* ln1_rstd;  // (BT)
    void* q;          // (B, NH, T, hd), bias added
    void* k;          // (B, NH, T, hd)
    void* v;          // (B, NH, T, hd)
    void* att;        // (B, NH, T, T): the softmax probabilities
    void* atty;       // (BT, C): the heads' outputs side by side
    void* res2;       // (BT, C)
    void* ln2;        // (BT, C)
    float* ln2_mean;  // (BT)
    float* ln2_rstd;  // (BT)
    void* fch;        // (BT, F): before the GELU
    void* fchg;       // (BT, F): after it
  };

  const ModelSpec spec_;
  const int64_t batch_;
  hal::ComputeDevice* const device_;  // outlives the model (the caller's promise)
  const Duration timeout_;
  std::unique_ptr<CudaGptKernels> kernels_;
  std::vector<TensorSpec> tensors_;
  int64_t num_parameters_ = 0;
  int head_ = 0;  // the tensor the LM head multiplies by: wte when tied, else lm_head.weight
  int lnf_ = 0;   // lnf.weight (the bias follows)
  int64_t vocab_ld_ = 0;  // the logits' row stride: the vocabulary padded to 64
  int64_t arena_bytes_ = 0;
  int64_t activation_bytes_ = 0;
  size_t act_bytes_ = 4;  // bytes of one activation element

  hal::DeviceBuffer f32_arena_;
  hal::DeviceBuffer act_arena_;
  hal::DeviceBuffer i32_arena_;
  hal::DeviceSpan<float> params_;
  hal::DeviceSpan<float> grads_;
  hal::DeviceSpan<hal::Bf16> params_bf16_;  // bf16 only
  int32_t* tokens_ = nullptr;               // (BT)
  int32_t* targets_ = nullptr;              // (BT)
  std::vector<void*> resid_;                // L + 1 of (BT, C)
  std::vector<LayerActs> layers_;
  void* lnf_out_ = nullptr;  // (BT, C)
  float* lnf_mean_ = nullptr;
  float* lnf_rstd_ = nullptr;
  void* logits_ = nullptr;     // (BT, vocab_ld): the logits' gradient after a training Forward
  float* losses_ = nullptr;    // (BT)
  float* partials_ = nullptr;  // (kNormBlocks): GradSquaredNorm's
  // Scratch shared by the layers.
  void* qkv_ = nullptr;   // (BT, 3C): the qkv product, and its gradient in the backward
  void* y_ = nullptr;     // (B, NH, T, hd): the heads' outputs, and their gradient
  void* tmp_ = nullptr;   // (BT, C): a product's output before its bias, an input gradient
  void* dres_ = nullptr;  // (BT, C): the residual stream's gradient
  void* dfch_ = nullptr;  // (BT, F)
  void* datt_ = nullptr;  // (B, NH, T, T)
  void* dq_ = nullptr;    // (B, NH, T, hd)
  void* dk_ = nullptr;
  void* dv_ = nullptr;
  std::vector<float> host_losses_;  // (BT)
  bool have_grad_ = false;          // the last Forward was a training one, not yet backpropagated
};

// AdamW (torch.optim.AdamW, as parallel/optimizer.h) over a CudaGpt's whole arena, its moments
// on the device. Weight decay on the matrices only. Not thread-safe.
class CudaAdamW {
 public:
  // The moments (zero) come from one allocation on the model's device. `model` is not owned
  // and must outlive this.
  static Result<std::unique_ptr<CudaAdamW>> Create(const TrainingSpec& training, CudaGpt* model);

  // One update of every parameter with learning rate `lr`, the gradients multiplied by
  // `grad_scale` (ClipScale) first; rewrites the model's bf16 copy. Enqueued.
  Status Step(double lr, double grad_scale);

  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  // The first moments of every parameter (arena order), then the second ones.
  hal::DeviceSpan<float> moments() const { return moments_.As<float>(); }

 private:
  CudaAdamW(const TrainingSpec& training, CudaGpt* model) : training_(training), model_(model) {}

  const TrainingSpec training_;
  CudaGpt* const model_;  // outlives this (the caller's promise)
  hal::DeviceBuffer moments_;
  hal::DeviceBuffer table_;  // the tensors' bounds (int64, tensors + 1), then decay flags
  int64_t steps_ = 0;
};

}  // namespace kc::parallel
