#include "parallel/gpt_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "hal/kernels.h"

namespace kc::parallel {
namespace {

// Elements a row-major (rows, cols) matrix with leading dimension ld spans.
int64_t Extent(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

template <typename Real>
void ZeroIfOverwriting(Real* x, int64_t n, bool accumulate) {
  if (!accumulate && x != nullptr) std::fill(x, x + n, Real{0});
}

// exp for the element-wise loops. In float, a branch-free approximation so that the loops
// vectorise (glibc's expf and tanhf are calls; tanhf took a third of a gpt-tiny step): Cephes'
// expf (range reduction by ln 2 in two parts, a degree-6 polynomial, the exponent set by
// bits), within 2 ulp over the clamped range. In double, the library's, so the gradient checks
// stay exact.
inline double Exp(double x) { return std::exp(x); }

inline float Exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);  // keeps 2^n a normal float; exp(-87.3) ~ 1e-38
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: SSE2 has no floor, and a call to floorf
  // would stop the loops around from vectorising.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r -= n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace

template <>
Status Gemm<float>(const KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc) {
  KC_CHECK(ctx.stream != nullptr) << "Gemm<float> needs a stream";
  const hal::DeviceId id = ctx.stream->device().id();
  const int64_t a_rows = trans_a ? k : m;
  const int64_t a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k;
  const int64_t b_cols = trans_b ? k : n;
  const auto size = [](int64_t v) { return static_cast<size_t>(v); };
  return hal::Sgemm(*ctx.stream,
                    {.trans_a = trans_a ? hal::Transpose::kYes : hal::Transpose::kNo,
                     .trans_b = trans_b ? hal::Transpose::kYes : hal::Transpose::kNo,
                     .m = m,
                     .n = n,
                     .k = k,
                     .alpha = alpha,
                     .a = hal::DeviceSpan<const float>(a, size(Extent(a_rows, a_cols, lda)), id),
                     .lda = lda,
                     .b = hal::DeviceSpan<const float>(b, size(Extent(b_rows, b_cols, ldb)), id),
                     .ldb = ldb,
                     .beta = beta,
                     .c = hal::DeviceSpan<float>(c, size(Extent(m, n, ldc)), id),
                     .ldc = ldc});
}

template <>
Status Gemm<double>(const KernelContext&, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, double alpha, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double beta, double* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += av * bv;
      }
      double& out = c[i * ldc + j];
      out = alpha * sum + (beta == 0 ? 0.0 : beta * out);
    }
  }
  return OkStatus();
}

template <typename Real>
Status GemmBatched(const KernelContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t k, Real alpha, const Real* a, int64_t lda, int64_t stride_a,
                   const Real* b, int64_t ldb, int64_t stride_b, Real beta, Real* c, int64_t ldc,
                   int64_t stride_c, int64_t batch) {
  for (int64_t i = 0; i < batch; ++i) {
    KC_RETURN_IF_ERROR(Gemm<Real>(ctx, trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda,
                                  b + i * stride_b, ldb, beta, c + i * stride_c, ldc));
  }
  return OkStatus();
}

template <typename Real>
void EncoderForward(Real* out, const int32_t* inp, const Real* wte, const Real* wpe, int64_t B,
                    int64_t T, int64_t C, int64_t v0, int64_t vl) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      Real* o = out + (b * T + t) * C;
      const int64_t row = static_cast<int64_t>(inp[b * T + t]) - v0;
      const bool mine = row >= 0 && (vl < 0 || row < vl);
      const Real* e = mine ? wte + row * C : nullptr;
      const Real* p = wpe != nullptr ? wpe + t * C : nullptr;
      if (mine && wpe != nullptr) {
        for (int64_t i = 0; i < C; ++i) o[i] = e[i] + p[i];
      } else if (mine) {
        std::copy(e, e + C, o);
      } else if (wpe != nullptr) {
        std::copy(p, p + C, o);
      } else {
        std::fill(o, o + C, Real{0});
      }
    }
  }
}

template <typename Real>
void EncoderBackward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* inp, int64_t B,
                     int64_t T, int64_t C, int64_t v0, int64_t vl) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const Real* d = dout + (b * T + t) * C;
      const int64_t row = static_cast<int64_t>(inp[b * T + t]) - v0;
      Real* dp = dwpe + t * C;
      if (row < 0 || (vl >= 0 && row >= vl)) {  // another rank's row
        for (int64_t i = 0; i < C; ++i) dp[i] += d[i];
        continue;
      }
      Real* de = dwte + row * C;
      for (int64_t i = 0; i < C; ++i) {
        de[i] += d[i];
        dp[i] += d[i];
      }
    }
  }
}

template <typename Real>
void LayerNormForward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                      const Real* bias, int64_t N, int64_t C, float eps) {
  for (int64_t r = 0; r < N; ++r) {
    const Real* x = inp + r * C;
    Real m = 0;
    for (int64_t i = 0; i < C; ++i) m += x[i];
    m /= static_cast<Real>(C);
    Real v = 0;
    for (int64_t i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= static_cast<Real>(C);
    const Real s = Real{1} / std::sqrt(v + static_cast<Real>(eps));
    Real* o = out + r * C;
    for (int64_t i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

template <typename Real>
void LayerNormBackward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                       const Real* weight, const Real* mean, const Real* rstd, int64_t N, int64_t C,
                       bool accumulate) {
  if (dweight != nullptr) {
    ZeroIfOverwriting(dweight, C, accumulate);
    ZeroIfOverwriting(dbias, C, accumulate);
  }
  for (int64_t r = 0; r < N; ++r) {
    const Real* d = dout + r * C;
    const Real* x = inp + r * C;
    const Real m = mean[r];
    const Real s = rstd[r];
    if (dinp == nullptr) {  // the weight pass alone
      for (int64_t i = 0; i < C; ++i) {
        dbias[i] += d[i];
        dweight[i] += (x[i] - m) * s * d[i];
      }
      continue;
    }
    // The two reductions of the input gradient (llm.c's layernorm_backward).
    Real dnorm_mean = 0;
    Real dnorm_norm_mean = 0;
    for (int64_t i = 0; i < C; ++i) {
      const Real norm = (x[i] - m) * s;
      const Real dnorm = weight[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<Real>(C);
    dnorm_norm_mean /= static_cast<Real>(C);
    Real* di = dinp + r * C;
    if (dweight == nullptr) {  // the input pass alone
      for (int64_t i = 0; i < C; ++i) {
        const Real norm = (x[i] - m) * s;
        di[i] += (weight[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
      continue;
    }
    for (int64_t i = 0; i < C; ++i) {
      const Real norm = (x[i] - m) * s;
      const Real dnorm = weight[i] * d[i];
      dbias[i] += d[i];
      dweight[i] += norm * d[i];
      di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

template <typename Real>
Status MatmulForward(const KernelContext& ctx, Real* out, const Real* inp, const Real* weight,
                     const Real* bias, int64_t N, int64_t C, int64_t OC) {
  KC_RETURN_IF_ERROR(
      Gemm<Real>(ctx, false, true, N, OC, C, Real{1}, inp, C, weight, C, Real{0}, out, OC));
  if (bias != nullptr) BiasForward(out, bias, N, OC);
  return OkStatus();
}

template <typename Real>
void BiasForward(Real* out, const Real* bias, int64_t N, int64_t OC) {
  for (int64_t r = 0; r < N; ++r) {
    Real* o = out + r * OC;
    for (int64_t j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

template <typename Real>
Status MatmulBackward(const KernelContext& ctx, Real* dinp, Real* dweight, Real* dbias,
                      const Real* dout, const Real* inp, const Real* weight, int64_t N, int64_t C,
                      int64_t OC, bool accumulate) {
  if (dinp != nullptr) {
    KC_RETURN_IF_ERROR(
        Gemm<Real>(ctx, false, false, N, C, OC, Real{1}, dout, OC, weight, C, Real{0}, dinp, C));
  }
  if (dweight == nullptr) return OkStatus();  // the input pass alone
  KC_RETURN_IF_ERROR(Gemm<Real>(ctx, true, false, OC, C, N, Real{1}, dout, OC, inp, C,
                                accumulate ? Real{1} : Real{0}, dweight, C));
  if (dbias != nullptr) {
    ZeroIfOverwriting(dbias, OC, accumulate);
    for (int64_t r = 0; r < N; ++r) {
      const Real* d = dout + r * OC;
      for (int64_t j = 0; j < OC; ++j) dbias[j] += d[j];
    }
  }
  return OkStatus();
}

template <typename Real>
Status AttentionForward(const KernelContext& ctx, Real* out, Real* att, const Real* qkv, int64_t B,
                        int64_t T, int64_t C, int64_t NH) {
  const int64_t hd = C / NH;
  const int64_t C3 = 3 * C;
  const Real scale = Real{1} / std::sqrt(static_cast<Real>(hd));
  for (int64_t b = 0; b < B; ++b) {
    const Real* q = qkv + b * T * C3;
    // Scores of every head at once: head h's q and k start hd columns apart.
    Real* att_b = att + b * NH * T * T;
    KC_RETURN_IF_ERROR(GemmBatched<Real>(ctx, false, true, T, T, hd, scale, q, C3, hd, q + C, C3,
                                         hd, Real{0}, att_b, T, T * T, NH));
    // Causal softmax, row by row; the masked part becomes 0 so the next product can run over
    // whole rows.
    for (int64_t r = 0; r < NH * T; ++r) {
      Real* row = att_b + r * T;
      const int64_t t = r % T;
      Real mx = row[0];
      for (int64_t j = 1; j <= t; ++j) mx = std::max(mx, row[j]);
      for (int64_t j = 0; j <= t; ++j) row[j] = Exp(row[j] - mx);  // vectorises
      Real sum = 0;
      for (int64_t j = 0; j <= t; ++j) sum += row[j];
      const Real inv = Real{1} / sum;
      for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
      std::fill(row + t + 1, row + T, Real{0});
    }
    // out[b, :, head h] = att[b, h] (T, T) * v_h (T, hd); the output heads interleave within
    // rows, so one product per head.
    for (int64_t h = 0; h < NH; ++h) {
      KC_RETURN_IF_ERROR(Gemm<Real>(ctx, false, false, T, hd, T, Real{1}, att_b + h * T * T, T,
                                    q + 2 * C + h * hd, C3, Real{0}, out + b * T * C + h * hd, C));
    }
  }
  return OkStatus();
}

template <typename Real>
Status AttentionBackward(const KernelContext& ctx, Real* dqkv, Real* datt, const Real* dout,
                         const Real* qkv, const Real* att, int64_t B, int64_t T, int64_t C,
                         int64_t NH) {
  const int64_t hd = C / NH;
  const int64_t C3 = 3 * C;
  const Real scale = Real{1} / std::sqrt(static_cast<Real>(hd));
  for (int64_t b = 0; b < B; ++b) {
    const Real* q = qkv + b * T * C3;
    Real* dq = dqkv + b * T * C3;
    const Real* d = dout + b * T * C;
    for (int64_t h = 0; h < NH; ++h) {
      const Real* a = att + (b * NH + h) * T * T;
      Real* da = datt + (b * NH + h) * T * T;
      const Real* d_h = d + h * hd;
      // datt = dout_h (T, hd) * v_h^T; dv_h = att^T * dout_h.
      KC_RETURN_IF_ERROR(Gemm<Real>(ctx, false, true, T, T, hd, Real{1}, d_h, C, q + 2 * C + h * hd,
                                    C3, Real{0}, da, T));
      KC_RETURN_IF_ERROR(Gemm<Real>(ctx, true, false, T, hd, T, Real{1}, a, T, d_h, C, Real{0},
                                    dq + 2 * C + h * hd, C3));
      // Softmax backward in place: dscore = att * (datt - sum_j att * datt), causal.
      for (int64_t t = 0; t < T; ++t) {
        const Real* ar = a + t * T;
        Real* dr = da + t * T;
        Real dot = 0;
        for (int64_t j = 0; j <= t; ++j) dot += ar[j] * dr[j];
        for (int64_t j = 0; j <= t; ++j) dr[j] = ar[j] * (dr[j] - dot);
        std::fill(dr + t + 1, dr + T, Real{0});
      }
      // dq_h = scale * dscore * k_h; dk_h = scale * dscore^T * q_h.
      KC_RETURN_IF_ERROR(Gemm<Real>(ctx, false, false, T, hd, T, scale, da, T, q + C + h * hd, C3,
                                    Real{0}, dq + h * hd, C3));
      KC_RETURN_IF_ERROR(Gemm<Real>(ctx, true, false, T, hd, T, scale, da, T, q + h * hd, C3,
                                    Real{0}, dq + C + h * hd, C3));
    }
  }
  return OkStatus();
}

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

// 0.5 (1 + tanh(u)) is the logistic sigmoid of 2u: computed that way there is no
// cancellation where tanh(u) nears -1, in float or double.
template <typename Real>
void GeluForward(Real* out, const Real* inp, int64_t n) {
  const Real s2 = static_cast<Real>(2 * kGeluScale);
  const Real c = static_cast<Real>(kGeluCubic);
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    out[i] = x / (Real{1} + Exp(-s2 * (x + c * x * x * x)));
  }
}

template <typename Real>
void GeluBackward(Real* dinp, const Real* inp, const Real* dout, int64_t n) {
  const Real s = static_cast<Real>(kGeluScale);
  const Real c = static_cast<Real>(kGeluCubic);
  // d/dx x sigma(2u) = sigma + x * 2 sigma (1 - sigma) * u', u' = s (1 + 3 c x^2); the same as
  // llm.c's 0.5 (1 + tanh u) + 0.5 x sech^2(u) u', since sech^2 u = 4 sigma (1 - sigma).
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    const Real sig = Real{1} / (Real{1} + Exp(Real{-2} * s * (x + c * x * x * x)));
    const Real local =
        sig + Real{2} * x * sig * (Real{1} - sig) * s * (Real{1} + Real{3} * c * x * x);
    dinp[i] = local * dout[i];
  }
}

template <typename Real>
void ResidualForward(Real* out, const Real* a, const Real* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename Real>
double CrossEntropy(Real* logits, Real* losses, const int32_t* targets, int64_t N, int64_t V,
                    Real grad_scale) {
  double total = 0;
  for (int64_t r = 0; r < N; ++r) {
    Real* row = logits + r * V;
    const int64_t target = targets[r];
    Real mx = row[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, row[j]);
    Real sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += Exp(row[j] - mx);
    const Real loss = std::log(sum) + mx - row[target];
    losses[r] = loss;
    total += static_cast<double>(loss);
    if (grad_scale != Real{0}) {
      const Real inv = Real{1} / sum;
      for (int64_t j = 0; j < V; ++j) row[j] = grad_scale * Exp(row[j] - mx) * inv;
      row[target] -= grad_scale;
    }
  }
  return total;
}

template <typename Real>
void CrossEntropyMax(const Real* logits, Real* mx, int64_t N, int64_t Vl, int64_t valid) {
  for (int64_t r = 0; r < N; ++r) {
    const Real* row = logits + r * Vl;
    Real m = -std::numeric_limits<Real>::infinity();
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, row[j]);
    mx[r] = m;
  }
}

template <typename Real>
void CrossEntropySums(const Real* logits, const Real* mx, const int32_t* targets, int64_t v0,
                      int64_t N, int64_t Vl, int64_t valid, Real* sums) {
  for (int64_t r = 0; r < N; ++r) {
    const Real* row = logits + r * Vl;
    Real sum = 0;
    for (int64_t j = 0; j < valid; ++j) sum += Exp(row[j] - mx[r]);
    const int64_t target = static_cast<int64_t>(targets[r]) - v0;
    sums[2 * r] = sum;
    sums[2 * r + 1] = target >= 0 && target < valid ? row[target] : Real{0};
  }
}

template <typename Real>
double CrossEntropyFinish(Real* logits, Real* losses, const Real* mx, const Real* sums,
                          const int32_t* targets, int64_t v0, int64_t N, int64_t Vl, int64_t valid,
                          Real grad_scale) {
  double total = 0;
  for (int64_t r = 0; r < N; ++r) {
    const Real sum = sums[2 * r];
    const Real loss = std::log(sum) + mx[r] - sums[2 * r + 1];
    losses[r] = loss;
    total += static_cast<double>(loss);
    if (grad_scale == Real{0}) continue;
    Real* row = logits + r * Vl;
    const Real inv = Real{1} / sum;
    for (int64_t j = 0; j < valid; ++j) row[j] = grad_scale * Exp(row[j] - mx[r]) * inv;
    std::fill(row + valid, row + Vl, Real{0});  // padding: no gradient
    const int64_t target = static_cast<int64_t>(targets[r]) - v0;
    if (target >= 0 && target < valid) row[target] -= grad_scale;
  }
  return total;
}

// The instantiations: float trains; double checks gradients.
#define KC_INSTANTIATE_GPT_KERNELS(Real)                                                           \
  template Status GemmBatched<Real>(const KernelContext&, bool, bool, int64_t, int64_t, int64_t,   \
                                    Real, const Real*, int64_t, int64_t, const Real*, int64_t,     \
                                    int64_t, Real, Real*, int64_t, int64_t, int64_t);              \
  template void EncoderForward<Real>(Real*, const int32_t*, const Real*, const Real*, int64_t,     \
                                     int64_t, int64_t, int64_t, int64_t);                          \
  template void EncoderBackward<Real>(Real*, Real*, const Real*, const int32_t*, int64_t, int64_t, \
                                      int64_t, int64_t, int64_t);                                  \
  template void BiasForward<Real>(Real*, const Real*, int64_t, int64_t);                           \
  template void CrossEntropyMax<Real>(const Real*, Real*, int64_t, int64_t, int64_t);              \
  template void CrossEntropySums<Real>(const Real*, const Real*, const int32_t*, int64_t, int64_t, \
                                       int64_t, int64_t, Real*);                                   \
  template double CrossEntropyFinish<Real>(Real*, Real*, const Real*, const Real*, const int32_t*, \
                                           int64_t, int64_t, int64_t, int64_t, Real);              \
  template void LayerNormForward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, \
                                       int64_t, int64_t, float);                                   \
  template void LayerNormBackward<Real>(Real*, Real*, Real*, const Real*, const Real*,             \
                                        const Real*, const Real*, const Real*, int64_t, int64_t,   \
                                        bool);                                                     \
  template Status MatmulForward<Real>(const KernelContext&, Real*, const Real*, const Real*,       \
                                      const Real*, int64_t, int64_t, int64_t);                     \
  template Status MatmulBackward<Real>(const KernelContext&, Real*, Real*, Real*, const Real*,     \
                                       const Real*, const Real*, int64_t, int64_t, int64_t, bool); \
  template Status AttentionForward<Real>(const KernelContext&, Real*, Real*, const Real*, int64_t, \
                                         int64_t, int64_t, int64_t);                               \
  template Status AttentionBackward<Real>(const KernelContext&, Real*, Real*, const Real*,         \
                                          const Real*, const Real*, int64_t, int64_t, int64_t,     \
                                          int64_t);                                                \
  template void GeluForward<Real>(Real*, const Real*, int64_t);                                    \
  template void GeluBackward<Real>(Real*, const Real*, const Real*, int64_t);                      \
  template void ResidualForward<Real>(Real*, const Real*, const Real*, int64_t);                   \
  template double CrossEntropy<Real>(Real*, Real*, const int32_t*, int64_t, int64_t, Real);

KC_INSTANTIATE_GPT_KERNELS(float)
KC_INSTANTIATE_GPT_KERNELS(double)
#undef KC_INSTANTIATE_GPT_KERNELS

}  // namespace kc::parallel
