// The GPT of a ModelSpec on one compute device: parameters, gradients and activations in one
// arena, a forward pass that returns the loss and a backward pass that announces each
// parameter gradient the moment it is final (so data parallelism can start reducing it while
// the backward goes on). The layers are gpt_kernels.h's; this file wires them as llm.c's
// gpt2_forward / gpt2_backward do.
//
//   KC_ASSIGN_OR_RETURN(auto model, Gpt<float>::Create(spec, device, {}));
//   model->InitParameters(spec.training.seed);
//   KC_ASSIGN_OR_RETURN(double loss, model->Forward(inputs, targets, 1.0 / model->tokens()));
//   KC_RETURN_IF_ERROR(model->Backward(false, [&](int tensor) { return OkStatus(); }));
//
// Not thread-safe: one training thread drives it (with GptOptions::threads > 1 it spreads
// each pass over a WorkerPool of its own).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "hal/compute.h"
#include "parallel/gpt_kernels.h"
#include "parallel/model_spec.h"
#include "parallel/worker_pool.h"

namespace kc::parallel {

struct GptOptions {
  // Sequences per forward; 0 means spec.batch_per_rank.
  int64_t batch = 0;
  // Threads that share each forward and backward, each taking whole sequences of the batch
  // (at most `batch` are used). With more than one, the device's BLAS should run one thread
  // per call: the parallelism is here, not inside each product.
  int threads = 1;
};

template <typename Real>
class Gpt {
 public:
  // Checks the spec (ValidateModelSpec) and allocates the arena on `device` (not owned; must
  // outlive the model): parameters, gradients, activations and the backward's scratch, so
  // nothing is allocated after this. Parameters start as zeros; call InitParameters or
  // write params(). kInvalidArgument for a bad spec or batch; kResourceExhausted when the
  // arena does not fit.
  static Result<std::unique_ptr<Gpt>> Create(const ModelSpec& spec, hal::ComputeDevice* device,
                                             const GptOptions& options);

  const ModelSpec& spec() const { return spec_; }
  int64_t batch() const { return batch_; }
  int64_t tokens() const { return batch_ * spec_.seq_len; }  // per forward: B * T
  // The parameter tensors (ParameterTensors(spec)), in forward order.
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  int64_t arena_bytes() const { return static_cast<int64_t>(arena_.size_bytes()); }

  // Every parameter, back to back in forward order (TensorSpec::offset).
  std::span<Real> params() { return params_; }
  std::span<const Real> params() const { return params_; }
  std::span<Real> param(int tensor);
  // The gradient of tensor i: in the model's own gradient arena, or where
  // SetGradientStorage put it.
  std::span<Real> grad(int tensor);

  // Gradients are written to `storage[i]` for tensor i from now on (each exactly
  // tensors()[i].num_elements long, disjoint, valid while the model is): the views of
  // communication buckets, so that no copy is made before reducing them.
  void SetGradientStorage(std::vector<std::span<Real>> storage);

  // GPT-2's initialisation: weights ~ N(0, 0.02), the two residual projections of each block
  // N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1. Deterministic in `seed` alone.
  void InitParameters(uint64_t seed);

  // Runs the model on inputs (B, T) and returns the mean cross-entropy against targets
  // (B, T). With grad_scale != 0 it also leaves the gradient of grad_scale * (sum of the
  // token losses) at the logits, ready for Backward (1 / tokens() for the mean over this
  // batch). kInvalidArgument for a token outside [0, vocab).
  Result<double> Forward(std::span<const int32_t> inputs, std::span<const int32_t> targets,
                         double grad_scale);

  // Backpropagates the last Forward (which must have had grad_scale != 0). Writes every
  // parameter gradient, or adds to it when `accumulate` (micro-batches), and calls
  // on_ready(i) as soon as tensor i's gradient is final, in ParameterTensorsBackwardOrder
  // order (with several threads, on whichever thread finishes the tensor last, one call at a
  // time, and possibly out of that order); an error from on_ready stops the pass and is
  // returned.
  Status Backward(bool accumulate, const std::function<Status(int tensor)>& on_ready);

 private:
  Gpt(ModelSpec spec, int64_t batch, hal::ComputeDevice* device);
  Status Allocate();

  // Per-layer tensor indices (ParameterTensors order).
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
  int LayerIndex(int64_t layer, LayerTensor t) const {
    return 2 + static_cast<int>(layer) * kTensorsPerLayer + t;
  }
  int LnfIndex() const { return 2 + static_cast<int>(spec_.layers) * kTensorsPerLayer; }
  Real* P(int i) { return params_.data() + tensors_[i].offset; }

  // What one layer's forward keeps for its backward.
  struct LayerActs {
    Real* ln1;        // (BT, C)
    Real* ln1_mean;   // (BT)
    Real* ln1_rstd;   // (BT)
    Real* qkv;        // (BT, 3C)
    Real* att;        // (B, NH, T, T)
    Real* atty;       // (BT, C)
    Real* residual2;  // (BT, C)
    Real* ln2;        // (BT, C)
    Real* ln2_mean;   // (BT)
    Real* ln2_rstd;   // (BT)
    Real* fch;        // (BT, F)
    Real* fch_gelu;   // (BT, F)
    Real* residual3;  // (BT, C): the layer's output
  };
  // `a` moved to sequence b0 of the batch.
  LayerActs Slice(const LayerActs& a, int64_t b0) const;
  // Worker k's share of a pass: sequences [slices_[k].first, slices_[k].second).
  Status ForwardSlice(int k, const int32_t* targets, Real grad_scale, double* loss_sum);
  Status BackwardSlice(int k, bool accumulate, const std::function<Status(int)>& on_ready);
  // A worker has finished its part of tensor i's gradient.
  Status TensorDone(int tensor, const std::function<Status(int)>& on_ready);

  const ModelSpec spec_;
  const int64_t batch_;
  hal::ComputeDevice* const device_;
  KernelContext ctx_;  // the device's default stream, worker 0's
  std::vector<TensorSpec> tensors_;
  std::vector<std::pair<int64_t, int64_t>> slices_;    // per worker: [first, end) sequences
  std::vector<KernelContext> ctxs_;                    // per worker
  std::vector<std::unique_ptr<hal::Stream>> streams_;  // workers 1..
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<std::atomic<int>[]> arrivals_;  // per tensor: workers done with it this pass
  Mutex ready_mu_;                                // one on_ready call at a time
  std::vector<Status> worker_status_;  // per worker, this pass (kept: no allocation per step)
  std::vector<double> worker_loss_;    // per worker: the sum of its tokens' losses
  std::span<Real> worker_arena_;
  std::vector<std::vector<std::span<Real>>> worker_grads_;  // workers 1..: per tensor
  hal::DeviceBuffer arena_;
  std::span<Real> params_;
  std::span<Real> own_grads_;
  std::vector<std::span<Real>> grads_;  // per tensor
  // Activations.
  Real* encoded_ = nullptr;  // (BT, C)
  std::vector<LayerActs> layers_;
  Real* lnf_ = nullptr;  // (BT, C)
  Real* lnf_mean_ = nullptr;
  Real* lnf_rstd_ = nullptr;
  Real* logits_ = nullptr;     // (BT, V); the logits' gradient after a training Forward
  Real* losses_ = nullptr;     // (BT)
  int32_t* inputs_ = nullptr;  // (BT): the last Forward's inputs, for the embedding backward
  // Backward scratch, shared by the layers.
  Real* dres_ = nullptr;  // (BT, C): the residual stream's gradient
  Real* dtmp_ = nullptr;  // (BT, C)
  Real* dqkv_ = nullptr;  // (BT, 3C)
  Real* dfch_ = nullptr;  // (BT, F)
  Real* datt_ = nullptr;  // (B, NH, T, T)
  bool have_grad_ = false;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace kc::parallel
