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
#include "parallel/tensor_parallel.h"
#include "parallel/worker_pool.h"

namespace kc::parallel {

struct GptOptions {
  // Sequences per forward; 0 means spec.batch_per_rank.
  int64_t batch = 0;
  // Threads that share each forward and backward, each taking whole sequences of the batch
  // (at most `batch` are used). With more than one, the device's BLAS should run one thread
  // per call: the parallelism is here, not inside each product.
  int threads = 1;
  // A pipeline stage: the blocks [first_layer, end_layer) (end_layer 0: every layer to the
  // last). The stage holding layer 0 also holds the embeddings and takes tokens; the stage
  // holding the last layer also holds the final LayerNorm, the LM head and the loss. Other
  // stages take the residual stream in (stage_input) and give it out (stage_output). With tied
  // embeddings a last stage that is not also the first keeps its own copy of wte for the head
  // (Megatron's arrangement); the two copies' gradients are the trainer's to add together.
  int64_t first_layer = 0;
  int64_t end_layer = 0;
  // Micro-batches whose activations are kept at once (a pipeline schedule's most in flight):
  // Forward and Backward name a slot in [0, slots).
  int slots = 1;
  // Keep, per slot, the output gradients the weight gradients need, so that the backward can
  // run as two passes, BackwardInput then BackwardWeight (ZB-H1).
  bool split_backward = false;
  // Activation recompute: a slot keeps only each layer's output; the backward runs each
  // layer's forward again from its input before backpropagating through it (one layer's
  // activations, shared by the slots). Not with split_backward.
  bool recompute = false;
  // Tensor parallelism: this model is rank tensor_parallel->rank() of the group's size() that
  // share every layer (Megatron's split, parallel/tensor_parallel.h): it holds its shard of
  // each split tensor (tensors() gives the shard shapes) and calls the group's AllReduce inside
  // Forward and Backward: per block, once on the attention's and once on the MLP's output in
  // the forward and once on each one's input gradient in the backward, plus the embeddings'
  // output, the loss's two row statistics and the LM head's input gradient. Every rank of the
  // group runs the same passes with the same inputs and gets the same loss. Not owned; null:
  // no tensor parallelism.
  TensorParallelGroup* tensor_parallel = nullptr;
};

// GPT-2's initialisation of tensor `index` of ParameterTensors(spec), the whole tensor, into
// `values` (exactly its num_elements): weights ~ N(0, 0.02), the two residual projections of
// each block N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1. Deterministic in `seed`
// and the index alone; what Gpt::InitParameters and the CUDA engine (cuda/cuda_gpt.h) start from.
template <typename Real>
void InitParameterTensor(const ModelSpec& spec, int index, uint64_t seed, std::span<Real> values);

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
  int64_t first_layer() const { return first_layer_; }
  int64_t end_layer() const { return end_layer_; }
  bool has_embedding() const { return first_layer_ == 0; }
  bool has_head() const { return end_layer_ == spec_.layers; }
  int slots() const { return static_cast<int>(slots_.size()); }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  // The parameter tensors this model holds, in forward order: ParameterTensors(spec) for the
  // whole model; for a stage, its subset (names kept, offsets counted within the stage).
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // Tensor i's index in ParameterTensors(spec) (initialisation uses it, so a stage's tensors
  // start as the whole model's).
  int global_index(int tensor) const { return global_index_.at(static_cast<size_t>(tensor)); }
  // How tensor i is split over the tensor-parallel group (kReplicated for every tensor
  // without one); ParameterTensors(spec)[global_index(i)] is the whole tensor's spec.
  TpSplit split(int tensor) const { return splits_.at(static_cast<size_t>(tensor)); }
  int64_t arena_bytes() const { return static_cast<int64_t>(arena_.size_bytes()); }
  // The part of the arena that holds the slots' activations (and, split, kept gradients).
  int64_t activation_bytes() const { return activation_bytes_; }

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
  // N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1. Deterministic in `seed` alone; a
  // tensor-parallel shard gets its part of the whole tensor's values.
  void InitParameters(uint64_t seed);

  // Runs the model on inputs (B, T) and returns the mean cross-entropy against targets
  // (B, T). With grad_scale != 0 it also leaves the gradient of grad_scale * (sum of the
  // token losses) at the logits, ready for Backward (1 / tokens() for the mean over this
  // batch). kInvalidArgument for a token outside [0, vocab).
  Result<double> Forward(std::span<const int32_t> inputs, std::span<const int32_t> targets,
                         double grad_scale) {
    return Forward(0, inputs, targets, grad_scale);
  }
  // The same into activation slot `slot`. A stage without the embeddings takes no inputs
  // (empty) but reads stage_input(slot); one without the head takes no targets (empty),
  // returns 0 and leaves stage_output(slot); grad_scale != 0 then only marks the pass for a
  // Backward. kInvalidArgument for a slot out of range or inputs/targets the stage does not
  // take.
  Result<double> Forward(int slot, std::span<const int32_t> inputs,
                         std::span<const int32_t> targets, double grad_scale);

  // Backpropagates the last Forward (which must have had grad_scale != 0). Writes every
  // parameter gradient, or adds to it when `accumulate` (micro-batches), and calls
  // on_ready(i) as soon as tensor i's gradient is final, in ParameterTensorsBackwardOrder
  // order (with several threads, on whichever thread finishes the tensor last, one call at a
  // time, and possibly out of that order); an error from on_ready stops the pass and is
  // returned.
  Status Backward(bool accumulate, const std::function<Status(int tensor)>& on_ready) {
    return Backward(0, accumulate, on_ready);
  }
  // The same for slot `slot`'s Forward. A stage without the head starts from grad_output(),
  // which the caller fills with the gradient of its stage_output(slot); one without the
  // embeddings ends with the gradient of its stage_input(slot) in grad_input().
  Status Backward(int slot, bool accumulate, const std::function<Status(int tensor)>& on_ready);

  // ZB-H1's split of Backward(slot, ...): the input-gradient pass (everything grad_input()
  // needs, no parameter gradient; kept for the weight pass), then the weight-gradient pass,
  // which writes (or with `accumulate` adds) every parameter gradient and announces each as
  // Backward does. Together they give Backward's gradients. kFailedPrecondition without
  // GptOptions::split_backward, or out of order.
  Status BackwardInput(int slot);
  Status BackwardWeight(int slot, bool accumulate,
                        const std::function<Status(int tensor)>& on_ready);

  // A stage's boundary buffers, B * T * C each (empty where the stage has no such boundary).
  std::span<Real> stage_input(int slot);         // the residual stream in; kept for Backward
  std::span<const Real> stage_output(int slot);  // the residual stream out, after Forward
  std::span<Real> grad_output();                 // its gradient in, before Backward
  std::span<const Real> grad_input();            // stage_input's gradient, after Backward

 private:
  Gpt(ModelSpec spec, int64_t batch, int64_t first_layer, int64_t end_layer,
      hal::ComputeDevice* device, TensorParallelGroup* tp);
  Status Allocate(int slots, bool split_backward, bool recompute);

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
  // Local tensor indices: of `layer` (global numbering; must be one of this stage's), and of
  // the final LayerNorm's weight (the bias follows).
  int LayerIndex(int64_t layer, LayerTensor t) const {
    return layer_base_ + static_cast<int>(layer - first_layer_) * kTensorsPerLayer + t;
  }
  Real* P(int i) { return params_.data() + tensors_[i].offset; }

  // Activation widths below are this rank's under tensor parallelism: the attention's (3C, C
  // of atty, NH) and the MLP's (F) divided by t, the logits' V the vocabulary shard.

  // The output gradients one layer's weight gradients need (split backward only).
  struct LayerGrads {
    Real* fcproj_out;  // (BT, C)
    Real* fc_out;      // (BT, F): after the GELU
    Real* ln2_out;     // (BT, C)
    Real* proj_out;    // (BT, C)
    Real* qkv_out;     // (BT, 3C)
    Real* ln1_out;     // (BT, C)
  };
  enum class Pass { kWhole, kInput, kWeight };
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
  // One micro-batch's activations.
  struct SlotActs {
    Real* input = nullptr;          // (BT, C): the embeddings' output, or the stage's input
    std::vector<LayerActs> layers;  // this stage's layers
    Real* lnf = nullptr;            // (BT, C); the head's, on the last stage
    Real* lnf_mean = nullptr;
    Real* lnf_rstd = nullptr;
    Real* logits = nullptr;     // (BT, V); the logits' gradient after a training Forward
    Real* losses = nullptr;     // (BT)
    int32_t* tokens = nullptr;  // (BT): the Forward's inputs, for the embedding backward
    // Split backward: what the weight pass needs.
    std::vector<LayerGrads> grads;
    Real* lnf_out_grad = nullptr;  // (BT, C)
    Real* input_grad = nullptr;    // (BT, C): the embeddings' output gradient
    bool have_input_grad = false;  // BackwardInput ran, BackwardWeight not yet
    bool have_grad = false;
  };
  // `a` moved to sequence b0 of the batch.
  LayerActs Slice(const LayerActs& a, int64_t b0) const;
  // Worker k's share of a pass: sequences [slices_[k].first, slices_[k].second).
  Status ForwardSlice(int k, SlotActs& s, const int32_t* targets, Real grad_scale,
                      double* loss_sum);
  Status BackwardSlice(int k, SlotActs& s, Pass pass, bool accumulate,
                       const std::function<Status(int)>& on_ready);
  // The embeddings' gradients from the gradient of their output (worker k's rows); the last
  // part of a whole backward and of a weight pass.
  Status EmbeddingBackward(int k, const SlotActs& s, const Real* dout, bool accumulate,
                           const std::function<Status(int)>& on_ready);
  // The weight pass of a split backward.
  Status WeightSlice(int k, SlotActs& s, bool accumulate,
                     const std::function<Status(int)>& on_ready);
  Status RunBackward(int slot, Pass pass, bool accumulate,
                     const std::function<Status(int)>& on_ready);
  // Layer l's activations for slot s: its own, or with recompute the shared ones with the
  // slot's output.
  LayerActs LayerFor(const SlotActs& s, int64_t l) const;
  // Worker k's part of one layer's forward from `residual` (its rows) into `whole` (every
  // row: the tensor-parallel all-reduces take every worker's).
  Status LayerForward(int k, const LayerActs& whole, const Real* residual, int64_t l);
  // Sums (or maxes) `count` elements at `data` over the tensor-parallel group, once every
  // worker has written its rows; nothing without tensor parallelism. Every worker calls it.
  Status AllReduce(Real* data, int64_t count, comm::ReduceOp op = comm::ReduceOp::kSum);
  // A worker has finished its part of tensor i's gradient.
  Status TensorDone(int tensor, const std::function<Status(int)>& on_ready);

  const ModelSpec spec_;
  const int64_t batch_;
  const int64_t first_layer_;
  const int64_t end_layer_;
  hal::ComputeDevice* const device_;
  TensorParallelGroup* const tp_;  // null without tensor parallelism
  const int tp_rank_;
  const int tp_size_;
  // This rank's widths: attention (C / t), heads, MLP hidden (F / t), vocabulary rows (the
  // shard, padding included), the first of them and how many are real.
  const int64_t attn_width_;
  const int64_t local_heads_;
  const int64_t ffn_width_;
  const int64_t vocab_rows_;
  const int64_t vocab_begin_;
  const int64_t vocab_valid_;
  KernelContext ctx_;  // the device's default stream, worker 0's
  std::vector<TensorSpec> tensors_;
  std::vector<int> global_index_;  // per local tensor
  std::vector<TpSplit> splits_;    // per local tensor
  // Local indices; -1 where the stage has no such tensor. head_ is wte_ when tied.
  int wte_ = -1;
  int wpe_ = -1;
  int layer_base_ = 0;
  int lnf_ = -1;
  int head_ = -1;
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
  std::vector<SlotActs> slots_;
  bool recompute_ = false;
  LayerActs recompute_layer_{};  // with recompute: the one layer's activations
  int64_t activation_bytes_ = 0;
  // Backward scratch, shared by the layers and the slots.
  Real* dres_ = nullptr;   // (BT, C): the residual stream's gradient (grad_output/grad_input)
  Real* dtmp_ = nullptr;   // (BT, C)
  Real* dqkv_ = nullptr;   // (BT, 3C)
  Real* dfch_ = nullptr;   // (BT, F)
  Real* datt_ = nullptr;   // (B, NH, T, T)
  Real* datty_ = nullptr;  // (BT, C): the attention output's gradient
  // The loss's row statistics (the head's): maxima (BT) and sums with target logits (BT, 2).
  Real* ce_max_ = nullptr;
  Real* ce_sums_ = nullptr;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace kc::parallel
