#include "parallel/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kc::parallel {
namespace {

TEST(LearningRateTest, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
  TrainingSpec t;
  t.lr = 1.0f;
  t.warmup_steps = 4;
  t.min_lr_fraction = 0.1f;
  EXPECT_DOUBLE_EQ(LearningRate(t, 0, 14), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(t, 3, 14), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 4, 14), 1.0);  // decay starts at the peak
  EXPECT_NEAR(LearningRate(t, 9, 14), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-7);
  EXPECT_NEAR(LearningRate(t, 14, 14), 0.1, 1e-7);  // the floor
  EXPECT_NEAR(LearningRate(t, 20, 14), 0.1, 1e-7);  // and stays there
  t.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRate(t, 0, 10), 1.0);
}

TEST(ClipScaleTest, ScalesOnlyAboveTheLimit) {
  TrainingSpec t;
  t.grad_clip = 1.0f;
  EXPECT_EQ(ClipScale(t, 0.5), 1.0);
  EXPECT_NEAR(ClipScale(t, 4.0), 1.0 / (4.0 + 1e-6), 1e-15);
  t.grad_clip = 0;
  EXPECT_EQ(ClipScale(t, 100.0), 1.0);
}

TEST(AdamWTest, MatchesTheTorchUpdateByHand) {
  auto device = hal::OpenComputeDevice({.id = "test/cpu0", .kind = hal::DeviceKind::kCpu});
  ASSERT_TRUE(device.ok());
  TrainingSpec t;
  t.beta1 = 0.9f;
  t.beta2 = 0.95f;
  t.eps = 1e-8f;
  t.weight_decay = 0.1f;
  std::vector<double> w = {1.0, -2.0}, b = {0.5};
  std::vector<double> gw = {0.3, -0.1}, gb = {2.0};
  auto opt = AdamW<double>::Create(t, {{w, gw, true}, {b, gb, false}}, device->get());
  ASSERT_TRUE(opt.ok());
  EXPECT_NEAR((*opt)->GradNorm(), std::sqrt(0.09 + 0.01 + 4.0), 1e-15);
  // Reference: torch.optim.AdamW's step, twice, with gradient scale 0.5.
  double pw = 1.0, pb = 0.5, mw = 0, vw = 0, mb = 0, vb = 0;
  const double lr = 0.01;
  for (int step = 1; step <= 2; ++step) {
    (*opt)->Step(lr, 0.5);
    const double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.95, step);
    const double g0 = 0.3 * 0.5, g2 = 2.0 * 0.5;
    pw *= 1 - lr * 0.1;
    mw = 0.9 * mw + 0.1 * g0;
    vw = 0.95 * vw + 0.05 * g0 * g0;
    pw -= lr / c1 * mw / (std::sqrt(vw) / std::sqrt(c2) + 1e-8);
    mb = 0.9 * mb + 0.1 * g2;
    vb = 0.95 * vb + 0.05 * g2 * g2;
    pb -= lr / c1 * mb / (std::sqrt(vb) / std::sqrt(c2) + 1e-8);
  }
  EXPECT_NEAR(w[0], pw, 1e-9);
  EXPECT_NEAR(b[0], pb, 1e-9);  // no decay on 1-D tensors
  EXPECT_EQ((*opt)->steps(), 2);
}

}  // namespace
}  // namespace kc::parallel
