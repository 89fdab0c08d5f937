// Finite-difference checks of every layer's backward, in double precision so the tolerance
// can be tight (1e-6 relative), plus float against double for the Sgemm path.
#include "parallel/gpt_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hal/kernels.h"

namespace kc::parallel {
namespace {

using Vec = std::vector<double>;

Vec Random(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  Vec v(n);
  for (double& x : v) x = dist(gen);
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` with central differences of `loss` in every element of `x`.
void ExpectGradient(const std::string& what, Vec& x, const Vec& analytic,
                    const std::function<double()>& loss, double tolerance = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const double h = 1e-5;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    const double err = std::fabs(numeric - analytic[i]) / std::max(1.0, std::fabs(numeric));
    if (err > worst) {
      worst = err;
      worst_at = i;
    }
  }
  EXPECT_LT(worst, tolerance) << what << ": worst relative error at element " << worst_at;
}

const KernelContext kNoStream;

TEST(GptKernelsTest, EncoderBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> inp = {1, 4, 1, 0, 2, 4};  // repeated tokens accumulate
  Vec wte = Random(V * C, 1), wpe = Random(T * C, 2), r = Random(B * T * C, 3);
  Vec out(B * T * C);
  auto loss = [&] {
    EncoderForward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(out, r);
  };
  Vec dwte(V * C, 0.0), dwpe(T * C, 0.0);
  EncoderBackward(dwte.data(), dwpe.data(), r.data(), inp.data(), B, T, C);
  ExpectGradient("wte", wte, dwte, loss);
  ExpectGradient("wpe", wpe, dwpe, loss);
}

TEST(GptKernelsTest, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t N = 5, C = 7;
  Vec x = Random(N * C, 4, 2.0), w = Random(C, 5), b = Random(C, 6), r = Random(N * C, 7);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                     1e-5f);
    return Dot(out, r);
  };
  loss();
  // dinp is added to: start from a known value and subtract it.
  Vec dx(N * C, 0.5), dw(C, 123.0), db(C, 123.0);
  LayerNormBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C, /*accumulate=*/false);
  for (double& v : dx) v -= 0.5;
  ExpectGradient("input", x, dx, loss);
  ExpectGradient("weight", w, dw, loss);
  ExpectGradient("bias", b, db, loss);
  // accumulate adds the same gradient again.
  Vec dw2 = dw, db2 = db, dx2(N * C, 0.0);
  LayerNormBackward(dx2.data(), dw2.data(), db2.data(), r.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C, /*accumulate=*/true);
  for (int64_t i = 0; i < C; ++i) {
    EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-12);
    EXPECT_NEAR(db2[i], 2 * db[i], 1e-12);
  }
}

TEST(GptKernelsTest, MatmulBackwardMatchesFiniteDifferences) {
  const int64_t N = 4, C = 5, OC = 3;
  Vec x = Random(N * C, 8), w = Random(OC * C, 9), b = Random(OC, 10), r = Random(N * OC, 11);
  Vec out(N * OC);
  auto loss = [&] {
    EXPECT_TRUE(MatmulForward(kNoStream, out.data(), x.data(), w.data(), b.data(), N, C, OC).ok());
    return Dot(out, r);
  };
  Vec dx(N * C), dw(OC * C, 99.0), db(OC, 99.0);
  ASSERT_TRUE(MatmulBackward(kNoStream, dx.data(), dw.data(), db.data(), r.data(), x.data(),
                             w.data(), N, C, OC, /*accumulate=*/false)
                  .ok());
  ExpectGradient("input", x, dx, loss);
  ExpectGradient("weight", w, dw, loss);
  ExpectGradient("bias", b, db, loss);
}

TEST(GptKernelsTest, AttentionBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 4, C = 6, NH = 2;
  Vec qkv = Random(B * T * 3 * C, 12), r = Random(B * T * C, 13);
  Vec out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    EXPECT_TRUE(AttentionForward(kNoStream, out.data(), att.data(), qkv.data(), B, T, C, NH).ok());
    return Dot(out, r);
  };
  loss();
  // Causality: every row of probabilities sums to 1 and is 0 above the diagonal.
  for (int64_t row = 0; row < B * NH * T; ++row) {
    const int64_t t = row % T;
    double sum = 0;
    for (int64_t j = 0; j < T; ++j) {
      if (j > t) EXPECT_EQ(att[row * T + j], 0.0);
      sum += att[row * T + j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  Vec dqkv(B * T * 3 * C, 7.0), datt(B * NH * T * T);
  ASSERT_TRUE(AttentionBackward(kNoStream, dqkv.data(), datt.data(), r.data(), qkv.data(),
                                att.data(), B, T, C, NH)
                  .ok());
  ExpectGradient("qkv", qkv, dqkv, loss);
}

TEST(GptKernelsTest, AttentionOfTheFirstTokenIsItsValue) {
  const int64_t B = 1, T = 3, C = 4, NH = 2;
  Vec qkv = Random(B * T * 3 * C, 14);
  Vec out(B * T * C), att(B * NH * T * T);
  ASSERT_TRUE(AttentionForward(kNoStream, out.data(), att.data(), qkv.data(), B, T, C, NH).ok());
  for (int64_t i = 0; i < C; ++i) EXPECT_DOUBLE_EQ(out[i], qkv[2 * C + i]);
}

TEST(GptKernelsTest, GeluBackwardMatchesFiniteDifferences) {
  const int64_t n = 50;
  Vec x = Random(n, 15, 3.0), r = Random(n, 16);
  Vec out(n);
  auto loss = [&] {
    GeluForward(out.data(), x.data(), n);
    return Dot(out, r);
  };
  Vec dx(n);
  GeluBackward(dx.data(), x.data(), r.data(), n);
  ExpectGradient("input", x, dx, loss);
  // In place gives the same.
  Vec inplace = r;
  GeluBackward(inplace.data(), x.data(), inplace.data(), n);
  EXPECT_EQ(inplace, dx);
  EXPECT_NEAR(
      out[0],
      0.5 * x[0] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[0] + 0.044715 * x[0] * x[0] * x[0]))),
      1e-15);
}

TEST(GptKernelsTest, CrossEntropyGradientMatchesFiniteDifferences) {
  const int64_t N = 3, V = 6;
  const std::vector<int32_t> targets = {0, 5, 2};
  Vec logits = Random(N * V, 17, 2.0), losses(N);
  auto loss = [&] {
    Vec copy = logits;
    return CrossEntropy(copy.data(), losses.data(), targets.data(), N, V, 0.0);
  };
  const double total = loss();
  // The loss of one row is logsumexp - logit[target].
  double lse = 0;
  for (int64_t j = 0; j < V; ++j) lse += std::exp(logits[j]);
  EXPECT_NEAR(losses[0], std::log(lse) - logits[0], 1e-12);
  Vec grad = logits;
  const double again = CrossEntropy(grad.data(), losses.data(), targets.data(), N, V, 1.0);
  EXPECT_DOUBLE_EQ(total, again);
  ExpectGradient("logits", logits, grad, loss);
}

// The float kernels use their own exp and tanh (vectorisable); they must stay as accurate as
// the library's to the precision training needs.
TEST(GptKernelsTest, FloatGeluSoftmaxAndCrossEntropyAgreeWithDouble) {
  const int64_t n = 4001;
  Vec x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -20.0 + 40.0 * static_cast<double>(i) / (n - 1);
  std::vector<float> xf(x.begin(), x.end()), outf(n), dinf(n), onesf(n, 1.0f);
  Vec out(n), din(n), ones(n, 1.0);
  Vec xd(xf.begin(), xf.end());  // the same inputs, exactly
  GeluForward(out.data(), xd.data(), n);
  GeluForward(outf.data(), xf.data(), n);
  GeluBackward(din.data(), xd.data(), ones.data(), n);
  GeluBackward(dinf.data(), xf.data(), onesf.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(outf[i], out[i], 4e-7 * std::max(1.0, std::fabs(out[i]))) << "x=" << xd[i];
    EXPECT_NEAR(dinf[i], din[i], 3e-6) << "x=" << xd[i];  // 1 - sigma loses a few bits
  }
  const int64_t N = 4, V = 300;
  Vec logits = Random(N * V, 21, 6.0);
  std::vector<float> lf(logits.begin(), logits.end());
  Vec ld(lf.begin(), lf.end());
  const std::vector<int32_t> targets = {0, 17, 299, 150};
  Vec losses(N);
  std::vector<float> lossesf(N);
  const double total = CrossEntropy(ld.data(), losses.data(), targets.data(), N, V, 1.0);
  const double totalf = CrossEntropy(lf.data(), lossesf.data(), targets.data(), N, V, 1.0f);
  EXPECT_NEAR(totalf, total, 1e-6 * std::fabs(total));
  // Probabilities minus one-hot: float sums of 300 terms, a few ulp of 1.
  for (int64_t i = 0; i < N * V; ++i) EXPECT_NEAR(lf[i], ld[i], 2e-6) << i;
}

TEST(GptKernelsTest, FloatGemmAgreesWithDouble) {
  auto device = hal::OpenComputeDevice({.id = "test/cpu0", .kind = hal::DeviceKind::kCpu});
  ASSERT_TRUE(device.ok()) << device.status();
  KernelContext ctx{.stream = &(*device)->default_stream()};
  const int64_t N = 9, C = 13, OC = 7;
  Vec x = Random(N * C, 18), w = Random(OC * C, 19), r = Random(N * OC, 20);
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), rf(r.begin(), r.end());
  Vec out(N * OC), dx(N * C), dw(OC * C);
  std::vector<float> outf(N * OC), dxf(N * C), dwf(OC * C);
  ASSERT_TRUE(
      MatmulForward<double>(kNoStream, out.data(), x.data(), w.data(), nullptr, N, C, OC).ok());
  ASSERT_TRUE(MatmulForward<float>(ctx, outf.data(), xf.data(), wf.data(), nullptr, N, C, OC).ok());
  ASSERT_TRUE(MatmulBackward<double>(kNoStream, dx.data(), dw.data(), nullptr, r.data(), x.data(),
                                     w.data(), N, C, OC, false)
                  .ok());
  ASSERT_TRUE(MatmulBackward<float>(ctx, dxf.data(), dwf.data(), nullptr, rf.data(), xf.data(),
                                    wf.data(), N, C, OC, false)
                  .ok());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(outf[i], out[i], 1e-4) << i;
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dxf[i], dx[i], 1e-4) << i;
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dwf[i], dw[i], 1e-4) << i;
}

}  // namespace
}  // namespace kc::parallel
