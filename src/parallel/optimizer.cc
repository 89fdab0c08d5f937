#include "parallel/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kc::parallel {

double LearningRate(const TrainingSpec& training, int64_t step, int64_t total_steps) {
  const double lr = training.lr;
  const int64_t warmup = training.warmup_steps;
  if (warmup > 0 && step < warmup) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const double progress =
      std::clamp(static_cast<double>(step - warmup) /
                     static_cast<double>(std::max<int64_t>(1, total_steps - warmup)),
                 0.0, 1.0);
  const double min_lr = lr * training.min_lr_fraction;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

double ClipScale(const TrainingSpec& training, double grad_norm) {
  if (training.grad_clip <= 0 || !(grad_norm > training.grad_clip)) return 1.0;
  return training.grad_clip / (grad_norm + 1e-6);
}

template <typename Real>
Result<std::unique_ptr<AdamW<Real>>> AdamW<Real>::Create(const TrainingSpec& training,
                                                         std::vector<OptimizerSlot<Real>> slots,
                                                         hal::ComputeDevice* device) {
  size_t total = 0;
  for (const OptimizerSlot<Real>& s : slots) {
    KC_CHECK(s.param.size() == s.grad.size()) << "optimizer slot of mismatched sizes";
    total += s.param.size();
  }
  std::unique_ptr<AdamW> opt(new AdamW(training, std::move(slots)));
  KC_ASSIGN_OR_RETURN(opt->arena_, device->Allocate(2 * total * sizeof(Real)));
  opt->moments_ = {static_cast<Real*>(opt->arena_.data()), 2 * total};
  std::fill(opt->moments_.begin(), opt->moments_.end(), Real{0});
  return opt;
}

template <typename Real>
double AdamW<Real>::GradNorm() const {
  double sum = 0;
  for (const OptimizerSlot<Real>& s : slots_) sum += SquaredNorm(s.grad);
  return std::sqrt(sum);
}

template <typename Real>
void AdamW<Real>::Step(double lr, double grad_scale) {
  ++steps_;
  const Real b1 = training_.beta1, b2 = training_.beta2, eps = training_.eps;
  const Real correction1 = static_cast<Real>(1.0 - std::pow(static_cast<double>(b1), steps_));
  const Real correction2 = static_cast<Real>(1.0 - std::pow(static_cast<double>(b2), steps_));
  const Real step_size = static_cast<Real>(lr) / correction1;
  const Real inv_sqrt_c2 = Real{1} / std::sqrt(correction2);
  const Real scale = static_cast<Real>(grad_scale);
  const size_t half = moments_.size() / 2;
  Real* m = moments_.data();
  Real* v = moments_.data() + half;
  for (const OptimizerSlot<Real>& s : slots_) {
    // torch.optim.AdamW: p *= 1 - lr * wd; p -= lr / c1 * m / (sqrt(v) / sqrt(c2) + eps).
    const Real keep = s.decay ? static_cast<Real>(1.0 - lr * training_.weight_decay) : Real{1};
    Real* p = s.param.data();
    const Real* g = s.grad.data();
    const size_t n = s.param.size();
    for (size_t i = 0; i < n; ++i) {
      const Real gi = g[i] * scale;
      m[i] = b1 * m[i] + (Real{1} - b1) * gi;
      v[i] = b2 * v[i] + (Real{1} - b2) * gi * gi;
      p[i] = p[i] * keep - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
    }
    m += n;
    v += n;
  }
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace kc::parallel
