// The CUDA engine on a real GPU (label gpu; skipped where no CUDA device is found): every
// kernel of cuda_gpt_kernels.h against its CPU reference (parallel/gpt_kernels.h, or a plain
// loop where the CPU engine inlines the step), the whole model's loss and every gradient
// against the CPU engine's from the same weights and batch, and training steps with AdamW
// against the CPU's. fp32 is held to fp32 rounding; bf16 to bf16's (inputs rounded to bf16
// on both sides, the tolerance stated beside each comparison).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hal/compute.h"
#include "hal/cuda/cuda_device.h"
#include "hal/kernels.h"
#include "parallel/cuda/cuda_gpt.h"
#include "parallel/cuda/cuda_gpt_kernels.h"
#include "parallel/gpt_kernels.h"
#include "parallel/gpt_model.h"
#include "parallel/optimizer.h"

namespace kc::parallel {
namespace {

constexpr uint32_t kSeed = 20261204;
constexpr auto kTimeout = std::chrono::seconds(60);

std::vector<float> Random(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max |got - want| over max |want|: one relative error for a whole tensor.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  KC_CHECK(got.size() == want.size());
  double err = 0, mag = 1e-12;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    err = std::max(err, std::fabs(double{got[i]} - double{want[i]}));
    mag = std::max(mag, std::fabs(double{want[i]}));
  }
  return err / mag;
}

// One GPU for every test: kernels compiled once per precision.
class GpuFixture : public ::testing::TestWithParam<Precision> {
 protected:
  static void SetUpTestSuite() {
    if (device_ != nullptr || skip_ != nullptr) return;
    Result<int> count = hal::cuda::CudaDeviceCount();
    if (!count.ok()) {
      skip_ = new std::string(count.status().ToString());
      return;
    }
    auto d = hal::OpenComputeDevice(
        {.id = "test/gpu0", .kind = hal::DeviceKind::kCuda, .host = "local", .index_on_host = 0});
    KC_CHECK(d.ok()) << d.status();
    device_ = std::move(d).value().release();
    cpu_ =
        hal::OpenComputeDevice({.id = "test/cpu", .kind = hal::DeviceKind::kCpu}).value().release();
  }
  void SetUp() override {
    if (device_ == nullptr) GTEST_SKIP() << "no CUDA device: " << *skip_;
    auto& k = kernels_[static_cast<int>(GetParam())];
    if (k == nullptr) {
      Result<std::unique_ptr<CudaGptKernels>> made = CudaGptKernels::Create(device_, GetParam());
      ASSERT_TRUE(made.ok()) << made.status();
      k = std::move(made).value().release();
    }
    k_ = k;
  }

  bool bf16() const { return GetParam() == Precision::kBf16; }
  // A tensor's tolerance, relative to its largest value: fp32 rounding (a few ulp through
  // a short chain of operations), or bf16's 2^-8 through the same chain.
  double Tol() const { return bf16() ? 2e-2 : 2e-5; }
  static hal::Stream& stream() { return device_->default_stream(); }

  // What an activation buffer holds of `v`: v itself, or v rounded to bf16.
  std::vector<float> Held(std::vector<float> v) const {
    if (bf16()) {
      for (float& x : v) x = hal::Bf16ToFloat(hal::FloatToBf16(x));
    }
    return v;
  }
  hal::DeviceBuffer Act(const std::vector<float>& v) const {
    hal::DeviceBuffer b = device_->Allocate(std::max<size_t>(v.size(), 1) * 4).value();
    if (bf16()) {
      std::vector<hal::Bf16> narrow(v.size());
      for (size_t i = 0; i < v.size(); ++i) narrow[i] = hal::FloatToBf16(v[i]);
      KC_CHECK(hal::CopyHostToDevice<hal::Bf16>(stream(), b.As<hal::Bf16>().first(v.size()), narrow)
                   .ok());
      KC_CHECK(hal::Synchronize(stream(), kTimeout).ok());
    } else {
      KC_CHECK(hal::CopyHostToDevice<float>(stream(), b.As<float>().first(v.size()), v).ok());
    }
    KC_CHECK(hal::Synchronize(stream(), kTimeout).ok());
    return b;
  }
  std::vector<float> ReadAct(const hal::DeviceBuffer& b, size_t n) const {
    std::vector<float> out(n);
    if (bf16()) {
      std::vector<hal::Bf16> narrow(n);
      KC_CHECK(hal::CopyDeviceToHost<hal::Bf16>(stream(), narrow, b.As<hal::Bf16>().first(n)).ok());
      KC_CHECK(hal::Synchronize(stream(), kTimeout).ok());
      for (size_t i = 0; i < n; ++i) out[i] = hal::Bf16ToFloat(narrow[i]);
    } else {
      KC_CHECK(hal::CopyDeviceToHost<float>(stream(), out, b.As<float>().first(n)).ok());
      KC_CHECK(hal::Synchronize(stream(), kTimeout).ok());
    }
    return out;
  }
  template <typename T>
  static hal::DeviceBuffer Raw(const std::vector<T>& v) {
    hal::DeviceBuffer b = device_->Allocate(std::max<size_t>(v.size(), 1) * sizeof(T)).value();
    KC_CHECK(hal::CopyHostToDevice<T>(stream(), b.As<T>().first(v.size()), v).ok());
    KC_CHECK(hal::Synchronize(stream(), kTimeout).ok());
    return b;
  }
  template <typename T>
  static std::vector<T> ReadRaw(const hal::DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    KC_CHECK(hal::CopyDeviceToHost<T>(stream(), v, b.As<T>().first(n)).ok());
    KC_CHECK(hal::Synchronize(stream(), kTimeout).ok());
    return v;
  }
  static void* P(const hal::DeviceBuffer& b) { return b.data(); }
  static float* F(const hal::DeviceBuffer& b) { return static_cast<float*>(b.data()); }

  static inline hal::ComputeDevice* device_ = nullptr;
  static inline hal::ComputeDevice* cpu_ = nullptr;
  static inline std::string* skip_ = nullptr;
  static inline CudaGptKernels* kernels_[2] = {nullptr, nullptr};
  CudaGptKernels* k_ = nullptr;
};

std::string PrecisionParamName(const ::testing::TestParamInfo<Precision>& info) {
  return std::string(PrecisionName(info.param));
}

using CudaGptKernelTest = GpuFixture;

TEST_P(CudaGptKernelTest, EncoderMatchesTheReference) {
  std::mt19937 rng(kSeed);
  const int64_t B = 3, T = 7, C = 40, V = 23;
  const std::vector<float> wte = Random(rng, V * C), wpe = Random(rng, T * C);
  std::vector<int32_t> inp(B * T);
  for (int32_t& t : inp) t = static_cast<int32_t>(rng() % V);
  inp[1] = inp[2] = inp[9];  // repeated tokens: their gradients add up
  hal::DeviceBuffer dwte = Raw(wte), dwpe = Raw(wpe), dinp = Raw(inp),
                    out = Act(std::vector<float>(B * T * C));
  ASSERT_TRUE(k_->EncoderForward(stream(), P(out), static_cast<int32_t*>(P(dinp)), F(dwte), F(dwpe),
                                 B, T, C)
                  .ok());
  std::vector<float> want(B * T * C);
  EncoderForward<float>(want.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_LE(RelativeError(ReadAct(out, want.size()), Held(want)), 1e-6);

  const std::vector<float> dout = Held(Random(rng, B * T * C));
  hal::DeviceBuffer d = Act(dout);
  std::vector<float> gwte = Random(rng, V * C), gwpe = Random(rng, T * C);
  hal::DeviceBuffer g1 = Raw(gwte), g2 = Raw(gwpe);
  ASSERT_TRUE(
      k_->EncoderBackward(stream(), F(g1), F(g2), P(d), static_cast<int32_t*>(P(dinp)), B, T, C)
          .ok());
  EncoderBackward<float>(gwte.data(), gwpe.data(), dout.data(), inp.data(), B, T, C);
  EXPECT_LE(RelativeError(ReadRaw<float>(g1, gwte.size()), gwte), 1e-6);
  EXPECT_LE(RelativeError(ReadRaw<float>(g2, gwpe.size()), gwpe), 1e-6);
}

TEST_P(CudaGptKernelTest, LayerNormForwardAndBackwardMatchTheReference) {
  std::mt19937 rng(kSeed);
  const int64_t N = 301, C = 96;
  const float eps = 1e-5f;
  const std::vector<float> inp = Held(Random(rng, N * C, 2.0f));
  const std::vector<float> w = Random(rng, C), b = Random(rng, C);
  hal::DeviceBuffer din = Act(inp), dw = Raw(w), db = Raw(b), out = Act(std::vector<float>(N * C));
  hal::DeviceBuffer mean = Raw(std::vector<float>(N)), rstd = Raw(std::vector<float>(N));
  ASSERT_TRUE(
      k_->LayerNormForward(stream(), P(out), F(mean), F(rstd), P(din), F(dw), F(db), N, C, eps)
          .ok());
  std::vector<float> want(N * C), wmean(N), wrstd(N);
  LayerNormForward<float>(want.data(), wmean.data(), wrstd.data(), inp.data(), w.data(), b.data(),
                          N, C, eps);
  EXPECT_LE(RelativeError(ReadAct(out, want.size()), want), Tol());
  EXPECT_LE(RelativeError(ReadRaw<float>(mean, N), wmean), 1e-5);
  EXPECT_LE(RelativeError(ReadRaw<float>(rstd, N), wrstd), 1e-5);

  const std::vector<float> dout = Held(Random(rng, N * C));
  const std::vector<float> dinp0 = Held(Random(rng, N * C));
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(overwrite ? "overwrite" : "accumulate");
    hal::DeviceBuffer dd = Act(dout), dinp = Act(dinp0);
    hal::DeviceBuffer gw = Raw(std::vector<float>(C, 0.0f)), gb = Raw(std::vector<float>(C, 0.0f));
    ASSERT_TRUE(k_->LayerNormBackward(stream(), P(dinp), F(gw), F(gb), P(dd), P(din), F(dw),
                                      F(mean), F(rstd), N, C, overwrite)
                    .ok());
    std::vector<float> wdinp = overwrite ? std::vector<float>(N * C, 0.0f) : dinp0;
    std::vector<float> wgw(C), wgb(C);
    LayerNormBackward<float>(wdinp.data(), wgw.data(), wgb.data(), dout.data(), inp.data(),
                             w.data(), wmean.data(), wrstd.data(), N, C, false);
    EXPECT_LE(RelativeError(ReadAct(dinp, wdinp.size()), wdinp), Tol());
    EXPECT_LE(RelativeError(ReadRaw<float>(gw, C), wgw), 1e-4);
    EXPECT_LE(RelativeError(ReadRaw<float>(gb, C), wgb), 1e-4);
  }
}

TEST_P(CudaGptKernelTest, BiasResidualAndGeluMatchTheReference) {
  std::mt19937 rng(kSeed);
  const int64_t N = 257, OC = 67, n = N * OC;
  const std::vector<float> x = Held(Random(rng, n)), y = Held(Random(rng, n)),
                           bias = Random(rng, OC);
  hal::DeviceBuffer dx = Act(x), dy = Act(y), dbias = Raw(bias), out = Act(std::vector<float>(n));
  // AddBias: BiasForward.
  ASSERT_TRUE(k_->AddBias(stream(), P(dx), F(dbias), N, OC).ok());
  std::vector<float> want = x;
  BiasForward<float>(want.data(), bias.data(), N, OC);
  EXPECT_LE(RelativeError(ReadAct(dx, n), Held(want)), 1e-6);
  // BiasBackward: the column sums MatmulBackward adds to dbias.
  hal::DeviceBuffer gsum = Raw(std::vector<float>(OC, 1.0f));
  ASSERT_TRUE(k_->BiasBackward(stream(), F(gsum), P(dy), N, OC).ok());
  std::vector<double> sums(OC, 1.0);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t j = 0; j < OC; ++j) sums[j] += y[r * OC + j];
  }
  EXPECT_LE(RelativeError(ReadRaw<float>(gsum, OC), std::vector<float>(sums.begin(), sums.end())),
            1e-5);
  // Residual.
  const std::vector<float> a = Held(Random(rng, n));
  hal::DeviceBuffer da = Act(a), dy2 = Act(y);
  ASSERT_TRUE(k_->Residual(stream(), P(out), P(da), P(dy2), n).ok());
  std::vector<float> sum(n);
  ResidualForward<float>(sum.data(), a.data(), y.data(), n);
  EXPECT_LE(RelativeError(ReadAct(out, n), Held(sum)), 1e-6);
  // GELU both ways (backward in place, as the model runs it).
  const std::vector<float> g = Held(Random(rng, n, 3.0f));
  hal::DeviceBuffer dg = Act(g), dgo = Act(std::vector<float>(n));
  ASSERT_TRUE(k_->GeluForward(stream(), P(dgo), P(dg), n).ok());
  std::vector<float> wg(n);
  GeluForward<float>(wg.data(), g.data(), n);
  EXPECT_LE(RelativeError(ReadAct(dgo, n), wg), Tol());
  hal::DeviceBuffer dd = Act(y);
  ASSERT_TRUE(k_->GeluBackward(stream(), P(dd), P(dg), P(dd), n).ok());
  std::vector<float> wd(n);
  GeluBackward<float>(wd.data(), g.data(), y.data(), n);
  EXPECT_LE(RelativeError(ReadAct(dd, n), wd), Tol());
}

TEST_P(CudaGptKernelTest, HeadsSplitAndMergeBackToTheSameRows) {
  std::mt19937 rng(kSeed);
  const int64_t B = 2, T = 5, NH = 3, hd = 4, C = NH * hd, ld = 3 * C;
  const std::vector<float> qkv = Held(Random(rng, B * T * ld));
  hal::DeviceBuffer dqkv = Act(qkv), part = Act(std::vector<float>(B * T * C));
  for (int64_t which = 0; which < 3; ++which) {
    ASSERT_TRUE(k_->SplitHeads(stream(), P(part), P(dqkv), B, T, NH, hd, ld, which * C).ok());
    const std::vector<float> got = ReadAct(part, B * T * C);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < NH; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t d = 0; d < hd; ++d) {
            ASSERT_EQ(got[((b * NH + h) * T + t) * hd + d],
                      qkv[(b * T + t) * ld + which * C + h * hd + d]);
          }
        }
      }
    }
  }
  hal::DeviceBuffer merged = Act(std::vector<float>(B * T * ld, -3.0f));
  for (int64_t which = 0; which < 3; ++which) {
    ASSERT_TRUE(k_->SplitHeads(stream(), P(part), P(dqkv), B, T, NH, hd, ld, which * C).ok());
    ASSERT_TRUE(k_->MergeHeads(stream(), P(merged), P(part), B, T, NH, hd, ld, which * C).ok());
  }
  EXPECT_EQ(ReadAct(merged, qkv.size()), qkv);
}

TEST_P(CudaGptKernelTest, CausalSoftmaxForwardAndBackwardMatchAPlainLoop) {
  std::mt19937 rng(kSeed);
  const int64_t rows = 3 * 70, T = 70;  // three sequences' rows of one head
  const std::vector<float> scores = Held(Random(rng, rows * T, 3.0f));
  hal::DeviceBuffer att = Act(scores);
  ASSERT_TRUE(k_->SoftmaxCausalForward(stream(), P(att), rows, T).ok());
  std::vector<float> want(rows * T, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= t; ++j) mx = std::max(mx, double{scores[r * T + j]});
    for (int64_t j = 0; j <= t; ++j) sum += std::exp(scores[r * T + j] - mx);
    for (int64_t j = 0; j <= t; ++j)
      want[r * T + j] = static_cast<float>(std::exp(scores[r * T + j] - mx) / sum);
  }
  const std::vector<float> probs = ReadAct(att, want.size());
  EXPECT_LE(RelativeError(probs, want), Tol());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = r % T + 1; j < T; ++j)
      ASSERT_EQ(probs[r * T + j], 0.0f) << "above the diagonal";
  }
  const std::vector<float> datt0 = Held(Random(rng, rows * T));
  hal::DeviceBuffer datt = Act(datt0);
  ASSERT_TRUE(k_->SoftmaxCausalBackward(stream(), P(datt), P(att), rows, T).ok());
  std::vector<float> wd(rows * T, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    double dot = 0;
    for (int64_t j = 0; j <= t; ++j) dot += double{probs[r * T + j]} * datt0[r * T + j];
    for (int64_t j = 0; j <= t; ++j)
      wd[r * T + j] = static_cast<float>(probs[r * T + j] * (datt0[r * T + j] - dot));
  }
  EXPECT_LE(RelativeError(ReadAct(datt, wd.size()), wd), Tol());
}

TEST_P(CudaGptKernelTest, CrossEntropyMatchesTheReferenceWithPaddedRows) {
  std::mt19937 rng(kSeed);
  for (int64_t V : {int64_t{50}, int64_t{5003}}) {  // one 256-thread and one 1024-thread block
    SCOPED_TRACE("V=" + std::to_string(V));
    const int64_t N = 37, ldv = V + 13;
    std::vector<float> logits = Held(Random(rng, N * ldv, 2.0f));
    std::vector<int32_t> targets(N);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng() % V);
    hal::DeviceBuffer dl = Act(logits), dt = Raw(targets), dloss = Raw(std::vector<float>(N));
    const float scale = 1.0f / static_cast<float>(N);
    ASSERT_TRUE(
        k_->CrossEntropy(stream(), P(dl), F(dloss), static_cast<int32_t*>(P(dt)), N, V, ldv, scale)
            .ok());
    // The reference on tight rows.
    std::vector<float> tight(N * V), losses(N);
    for (int64_t r = 0; r < N; ++r) std::copy_n(logits.begin() + r * ldv, V, tight.begin() + r * V);
    CrossEntropy<float>(tight.data(), losses.data(), targets.data(), N, V, scale);
    EXPECT_LE(RelativeError(ReadRaw<float>(dloss, N), losses), bf16() ? 1e-3 : 1e-5);
    const std::vector<float> got = ReadAct(dl, logits.size());
    std::vector<float> got_tight(N * V);
    for (int64_t r = 0; r < N; ++r) {
      std::copy_n(got.begin() + r * ldv, V, got_tight.begin() + r * V);
      for (int64_t j = V; j < ldv; ++j)
        ASSERT_EQ(got[r * ldv + j], logits[r * ldv + j]) << "padding written";
    }
    EXPECT_LE(RelativeError(got_tight, tight), Tol());
  }
}

TEST_P(CudaGptKernelTest, SquaredSumsAndAdamWMatchTheReference) {
  std::mt19937 rng(kSeed);
  // Three tensors: a matrix (decayed), a vector, a matrix.
  const std::vector<int64_t> bounds = {0, 600, 640, 1240};
  const std::vector<uint8_t> decay = {1, 0, 1};
  const int64_t n = bounds.back();
  std::vector<float> params = Random(rng, n), grads = Random(rng, n, 0.1f);
  hal::DeviceBuffer dp = Raw(params), dg = Raw(grads);
  hal::DeviceBuffer partials = Raw(std::vector<float>(64));
  ASSERT_TRUE(k_->SquaredSumPartials(stream(), F(partials), 64, F(dg), n).ok());
  double got_sq = 0, want_sq = 0;
  for (float p : ReadRaw<float>(partials, 64)) got_sq += p;
  for (float g : grads) want_sq += double{g} * g;
  EXPECT_NEAR(got_sq, want_sq, 1e-5 * want_sq);

  // Three AdamW steps against AdamW<float>, with clipping's scale.
  TrainingSpec training;
  training.weight_decay = 0.1f;
  std::vector<float> cpu_params = params;
  std::vector<OptimizerSlot<float>> slots;
  for (size_t t = 0; t + 1 < bounds.size(); ++t) {
    slots.push_back({std::span<float>(cpu_params).subspan(bounds[t], bounds[t + 1] - bounds[t]),
                     std::span<const float>(grads).subspan(bounds[t], bounds[t + 1] - bounds[t]),
                     decay[t] == 1});
  }
  auto cpu_opt = AdamW<float>::Create(training, slots, cpu_).value();
  hal::DeviceBuffer m = Raw(std::vector<float>(n, 0.0f)), v = Raw(std::vector<float>(n, 0.0f));
  hal::DeviceBuffer db = Raw(bounds), dd = Raw(decay);
  hal::DeviceBuffer act = Act(params);
  for (int step = 1; step <= 3; ++step) {
    const double lr = 1e-3 * step, scale = 0.5;
    cpu_opt->Step(lr, scale);
    const float c1 = static_cast<float>(1.0 - std::pow(double{training.beta1}, step));
    const float c2 = static_cast<float>(1.0 - std::pow(double{training.beta2}, step));
    CudaAdamWArgs args{.params = F(dp),
                       .params_act = bf16() ? P(act) : nullptr,
                       .grads = F(dg),
                       .m = F(m),
                       .v = F(v),
                       .bounds = static_cast<const int64_t*>(P(db)),
                       .decay = static_cast<const uint8_t*>(P(dd)),
                       .tensors = 3,
                       .n = n,
                       .beta1 = training.beta1,
                       .beta2 = training.beta2,
                       .eps = training.eps,
                       .step_size = static_cast<float>(lr) / c1,
                       .inv_sqrt_c2 = 1.0f / std::sqrt(c2),
                       .grad_scale = static_cast<float>(scale),
                       .keep = static_cast<float>(1.0 - lr * training.weight_decay)};
    ASSERT_TRUE(k_->AdamW(stream(), args).ok());
  }
  EXPECT_LE(RelativeError(ReadRaw<float>(dp, n), cpu_params), 1e-5);
  if (bf16()) EXPECT_LE(RelativeError(ReadAct(act, n), cpu_params), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGptKernelTest,
                         ::testing::Values(Precision::kFp32, Precision::kBf16), PrecisionParamName);

// The whole model against the CPU engine: the same initial weights, the same batch, the same
// loss and gradients (fp32 within fp32 rounding through the model; bf16 within bf16's).
ModelSpec TestSpec(bool tied) {
  ModelSpec s;
  s.name = "cuda-check";
  s.layers = 2;
  s.hidden = 64;
  s.heads = 4;
  s.ffn_hidden = 256;
  s.vocab = 101;  // the logits' rows are padded to 128
  s.seq_len = 32;
  s.batch_per_rank = 3;
  s.tied_embeddings = tied;
  s.training.lr = 1e-3f;
  s.training.warmup_steps = 2;
  s.training.weight_decay = 0.1f;
  return s;
}

std::vector<int32_t> Tokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

using CudaGptModelTest = GpuFixture;

TEST_P(CudaGptModelTest, LossAndEveryGradientMatchTheCpuEngine) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ModelSpec spec = TestSpec(tied);
    auto cpu = Gpt<float>::Create(spec, cpu_, {}).value();
    cpu->InitParameters(spec.training.seed);
    Result<std::unique_ptr<CudaGpt>> made =
        CudaGpt::Create(spec, device_, {.precision = GetParam()});
    ASSERT_TRUE(made.ok()) << made.status();
    CudaGpt& gpu = **made;
    ASSERT_TRUE(gpu.InitParameters(spec.training.seed).ok());
    std::vector<float> params(static_cast<size_t>(gpu.num_parameters()));
    ASSERT_TRUE(gpu.GetParameters(params).ok());
    ASSERT_TRUE(std::equal(params.begin(), params.end(), cpu->params().begin()))
        << "the two engines start from different weights";
    std::mt19937 rng(kSeed);
    const int64_t BT = gpu.tokens();
    const std::vector<int32_t> in = Tokens(rng, BT, spec.vocab), tg = Tokens(rng, BT, spec.vocab);
    const double scale = 1.0 / static_cast<double>(BT);
    Result<double> cpu_loss = cpu->Forward(in, tg, scale);
    ASSERT_TRUE(cpu_loss.ok());
    ASSERT_TRUE(cpu->Backward(false, [](int) { return OkStatus(); }).ok());
    ASSERT_TRUE(gpu.ZeroGradients().ok());
    Result<double> gpu_loss = gpu.Forward(in, tg, scale);
    ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
    ASSERT_TRUE(gpu.Backward().ok());
    ASSERT_TRUE(gpu.Synchronize().ok());
    EXPECT_NEAR(*gpu_loss, *cpu_loss, (bf16() ? 1e-2 : 1e-5) * *cpu_loss);
    std::vector<float> grads(params.size());
    ASSERT_TRUE(hal::CopyDeviceToHost<float>(stream(), grads, gpu.grads()).ok());
    ASSERT_TRUE(gpu.Synchronize().ok());
    for (size_t i = 0; i < gpu.tensors().size(); ++i) {
      const TensorSpec& t = gpu.tensors()[i];
      const std::span<float> want = cpu->grad(static_cast<int>(i));
      const std::vector<float> got(grads.begin() + t.offset,
                                   grads.begin() + t.offset + t.num_elements);
      EXPECT_LE(RelativeError(got, std::vector<float>(want.begin(), want.end())),
                bf16() ? 1e-1 : 1e-3)
          << t.name;
    }
    // Evaluation: the same loss without gradients.
    Result<double> eval = gpu.Forward(in, tg, 0);
    ASSERT_TRUE(eval.ok());
    EXPECT_NEAR(*eval, *gpu_loss, 1e-6 * *gpu_loss);
    EXPECT_EQ(gpu.Backward().code(), ErrorCode::kFailedPrecondition);
    EXPECT_EQ(gpu.Forward(std::vector<int32_t>(BT, spec.vocab), tg, scale).status().code(),
              ErrorCode::kInvalidArgument);
  }
}

// Training steps: forward, backward, clipping's scale and AdamW, as the trainer runs them,
// against the CPU engine and AdamW<float> on the same batches.
TEST_P(CudaGptModelTest, TrainingStepsFollowTheCpuEnginesLosses) {
  const ModelSpec spec = TestSpec(true);
  auto cpu = Gpt<float>::Create(spec, cpu_, {}).value();
  cpu->InitParameters(spec.training.seed);
  std::vector<OptimizerSlot<float>> slots;
  for (size_t i = 0; i < cpu->tensors().size(); ++i) {
    slots.push_back({cpu->param(static_cast<int>(i)), cpu->grad(static_cast<int>(i)),
                     cpu->tensors()[i].shape.size() == 2});
  }
  auto cpu_opt = AdamW<float>::Create(spec.training, slots, cpu_).value();
  auto gpu = CudaGpt::Create(spec, device_, {.precision = GetParam()}).value();
  ASSERT_TRUE(gpu->InitParameters(spec.training.seed).ok());
  auto gpu_opt = CudaAdamW::Create(spec.training, gpu.get()).value();
  std::mt19937 rng(kSeed);
  const int64_t BT = gpu->tokens();
  const double scale = 1.0 / static_cast<double>(BT);
  const int steps = 8;
  for (int s = 0; s < steps; ++s) {
    const std::vector<int32_t> in = Tokens(rng, BT, 16), tg = Tokens(rng, BT, 16);
    const double lr = LearningRate(spec.training, s, steps);
    const double cpu_loss = cpu->Forward(in, tg, scale).value();
    ASSERT_TRUE(cpu->Backward(false, [](int) { return OkStatus(); }).ok());
    const double cpu_norm = cpu_opt->GradNorm();
    cpu_opt->Step(lr, ClipScale(spec.training, cpu_norm));

    ASSERT_TRUE(gpu->ZeroGradients().ok());
    Result<double> gpu_loss = gpu->Forward(in, tg, scale);
    ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
    ASSERT_TRUE(gpu->Backward().ok());
    Result<double> squares = gpu->GradSquaredNorm();
    ASSERT_TRUE(squares.ok());
    const double gpu_norm = std::sqrt(*squares);
    ASSERT_TRUE(gpu_opt->Step(lr, ClipScale(spec.training, gpu_norm)).ok());
    ASSERT_TRUE(gpu->Synchronize().ok());
    EXPECT_NEAR(*gpu_loss, cpu_loss, (bf16() ? 2e-2 : 1e-4) * cpu_loss) << "step " << s;
    EXPECT_NEAR(gpu_norm, cpu_norm, (bf16() ? 1e-1 : 1e-3) * cpu_norm) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGptModelTest,
                         ::testing::Values(Precision::kFp32, Precision::kBf16), PrecisionParamName);

}  // namespace
}  // namespace kc::parallel
