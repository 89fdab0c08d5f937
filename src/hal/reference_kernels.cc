#include "hal/reference_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "base/check.h"

// As the CPU kernels: no FMA contraction, so both compute the same IEEE operations.
#pragma STDC FP_CONTRACT OFF

namespace kc::hal::reference {

void Sgemm(const SgemmArgs& g) {
  const bool ta = g.trans_a == Transpose::kYes;
  const bool tb = g.trans_b == Transpose::kYes;
  const auto a = [&](int64_t i, int64_t p) { return ta ? g.a[p * g.lda + i] : g.a[i * g.lda + p]; };
  const auto b = [&](int64_t p, int64_t j) { return tb ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j]; };
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double out = 0.0;
      if (g.alpha != 0.0f) {
        double dot = 0.0;
        for (int64_t p = 0; p < g.k; ++p) dot += double{a(i, p)} * double{b(p, j)};
        out = double{g.alpha} * dot;
      }
      float& c = g.c[i * g.ldc + j];
      if (g.beta != 0.0f) out += double{g.beta} * double{c};
      c = static_cast<float>(out);
    }
  }
}

void SgemmStridedBatched(const SgemmArgs& args, int64_t batch_count, int64_t stride_a,
                         int64_t stride_b, int64_t stride_c) {
  for (int64_t i = 0; i < batch_count; ++i) {
    SgemmArgs one = args;
    one.a = args.a.subspan(static_cast<size_t>(i * stride_a));
    one.b = args.b.subspan(static_cast<size_t>(i * stride_b));
    one.c = args.c.subspan(static_cast<size_t>(i * stride_c));
    Sgemm(one);
  }
}

Bf16 RoundToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return Bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  // The neighbour toward zero (truncation) and the one away from zero.
  const uint16_t down = static_cast<uint16_t>(u >> 16);
  const float down_value = Bf16ToFloat(Bf16{down});
  if (down_value == f) return Bf16{down};
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const bool up_is_inf = (up & 0x7FFFu) == 0x7F80u;
  const double v = std::fabs(double{f});
  const double v_down = std::fabs(double{down_value});
  const double v_up = up_is_inf ? std::ldexp(1.0, 128) : std::fabs(double{Bf16ToFloat(Bf16{up})});
  const double to_down = v - v_down;  // exact: doubles hold these floats' differences
  const double to_up = v_up - v;
  if (to_down < to_up) return Bf16{down};
  if (to_up < to_down) return Bf16{up};
  return Bf16{(down & 1u) == 0 ? down : up};
}

namespace {

template <typename T>
T Apply(T a, T b, ReduceOp op) {
  if constexpr (std::is_floating_point_v<T>) {
    if ((op == ReduceOp::kMin || op == ReduceOp::kMax) && (std::isnan(a) || std::isnan(b))) {
      return std::numeric_limits<T>::quiet_NaN();
    }
  }
  switch (op) {
    case ReduceOp::kSum:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(U(a) + U(b));
      } else {
        return a + b;
      }
    case ReduceOp::kProd:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(U(a) * U(b));
      } else {
        return a * b;
      }
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  KC_CHECK(false) << "unknown ReduceOp";
  return a;
}

template <typename T>
void ReduceLoop(std::span<T> dst, std::span<const T> src, ReduceOp op) {
  KC_CHECK(dst.size() == src.size());
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = Apply(dst[i], src[i], op);
}

}  // namespace

void ReduceInto(std::span<float> dst, std::span<const float> src, ReduceOp op) {
  ReduceLoop(dst, src, op);
}
void ReduceInto(std::span<double> dst, std::span<const double> src, ReduceOp op) {
  ReduceLoop(dst, src, op);
}
void ReduceInto(std::span<int32_t> dst, std::span<const int32_t> src, ReduceOp op) {
  ReduceLoop(dst, src, op);
}
void ReduceInto(std::span<int64_t> dst, std::span<const int64_t> src, ReduceOp op) {
  ReduceLoop(dst, src, op);
}
void ReduceInto(std::span<Bf16> dst, std::span<const Bf16> src, ReduceOp op) {
  KC_CHECK(dst.size() == src.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i] = RoundToBf16(Apply(Bf16ToFloat(dst[i]), Bf16ToFloat(src[i]), op));
  }
}

void Scale(std::span<float> x, float alpha) {
  for (float& v : x) v = alpha * v;
}
void Scale(std::span<double> x, double alpha) {
  for (double& v : x) v = alpha * v;
}
void Scale(std::span<Bf16> x, float alpha) {
  for (Bf16& v : x) v = RoundToBf16(alpha * Bf16ToFloat(v));
}

void Axpy(std::span<float> y, float alpha, std::span<const float> x) {
  KC_CHECK(y.size() == x.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = y[i] + alpha * x[i];
}
void Axpy(std::span<double> y, double alpha, std::span<const double> x) {
  KC_CHECK(y.size() == x.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = y[i] + alpha * x[i];
}
void Axpy(std::span<Bf16> y, float alpha, std::span<const Bf16> x) {
  KC_CHECK(y.size() == x.size());
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] = RoundToBf16(Bf16ToFloat(y[i]) + alpha * Bf16ToFloat(x[i]));
  }
}

void ConvertF32ToBf16(std::span<Bf16> dst, std::span<const float> src) {
  KC_CHECK(dst.size() == src.size());
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = RoundToBf16(src[i]);
}
void ConvertBf16ToF32(std::span<float> dst, std::span<const Bf16> src) {
  KC_CHECK(dst.size() == src.size());
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = Bf16ToFloat(src[i]);
}

}  // namespace kc::hal::reference
