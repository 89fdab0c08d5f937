// The optimizer of training: AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on
// the matrices only, gradient clipping by the global L2 norm, and a linear-warmup +
// cosine-decay learning rate. The rules match torch.optim.AdamW and
// torch.nn.utils.clip_grad_norm_ exactly, so that bench/train/compare_losses.py can hold the
// engine to PyTorch's losses.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "hal/compute.h"
#include "parallel/model_spec.h"

namespace kc::parallel {

// The learning rate of step `step` (0-based) of a run of `total_steps`:
//   step < warmup:  lr * (step + 1) / warmup
//   else:           min + (lr - min) * (1 + cos(pi * p)) / 2,
//                   p = (step - warmup) / max(1, total_steps - warmup), min = lr * min_lr_fraction.
double LearningRate(const TrainingSpec& training, int64_t step, int64_t total_steps);

// What clip_grad_norm_ multiplies the gradients by: grad_clip / (norm + 1e-6) when clipping
// is on (grad_clip > 0) and norm > grad_clip, else 1.
double ClipScale(const TrainingSpec& training, double grad_norm);

// The sum of squares of one tensor's gradient: accumulated in Real (the loop vectorises), then
// widened, so that norms summed over tensors in double are the same wherever they are taken.
template <typename Real>
double SquaredNorm(std::span<const Real> grad) {
  Real part = 0;
  for (Real g : grad) part += g * g;
  return static_cast<double>(part);
}

// One tensor the optimizer updates.
template <typename Real>
struct OptimizerSlot {
  std::span<Real> param;
  std::span<const Real> grad;  // same size as param
  bool decay = false;          // weight decay applies (the 2-D tensors)
};

template <typename Real>
class AdamW {
 public:
  // The two moment buffers (zero) come from one allocation on `device` (not owned; must
  // outlive this). The slots' spans must stay valid.
  static Result<std::unique_ptr<AdamW>> Create(const TrainingSpec& training,
                                               std::vector<OptimizerSlot<Real>> slots,
                                               hal::ComputeDevice* device);

  // The L2 norm of every slot's gradient together (accumulated in double).
  double GradNorm() const;

  // One update with learning rate `lr`, every gradient multiplied by `grad_scale` first
  // (ClipScale). Bias corrections count the updates made so far.
  void Step(double lr, double grad_scale);

  int64_t steps() const { return steps_; }
  // Restoring a checkpoint: the updates made so far (the bias corrections count them).
  void set_steps(int64_t steps) { steps_ = steps; }
  // The first and second moments of every slot, back to back in slot order (checkpoints).
  std::span<Real> moments() { return moments_; }

 private:
  AdamW(const TrainingSpec& training, std::vector<OptimizerSlot<Real>> slots)
      : training_(training), slots_(std::move(slots)) {}

  const TrainingSpec training_;
  const std::vector<OptimizerSlot<Real>> slots_;
  hal::DeviceBuffer arena_;
  std::span<Real> moments_;
  int64_t steps_ = 0;
};

extern template class AdamW<float>;
extern template class AdamW<double>;

}  // namespace kc::parallel
