#include "hal/cpu/cpu_kernels.h"

#include <cstdint>
#include <type_traits>

// No FMA contraction: every element is the same IEEE operations on every ISA clone (and in
// the reference), so data-parallel replicas on hosts with different CPUs stay bitwise equal.
#pragma STDC FP_CONTRACT OFF

// Each entry point is compiled for AVX-512BW, AVX2 and the x86-64 baseline; the loader picks
// the best the CPU has (an ifunc). The loops below are forced inline so that each clone
// vectorises them for its own ISA. Elsewhere, one plain version.
#if defined(__x86_64__) && defined(__clang__)
#define KC_VECTOR_CLONES __attribute__((target_clones("avx512bw", "avx2", "default")))
#else
#define KC_VECTOR_CLONES
#endif
#define KC_INLINE [[gnu::always_inline]] inline

namespace kc::hal::cpu {
namespace {

// Integer sum and product wrap modulo 2^bits: computed in the unsigned type, where overflow
// is defined, and converted back (modular since C++20).
template <typename T>
struct Sum {
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
template <typename T>
struct Prod {
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
// Min and max propagate NaN: a NaN a is kept by the first test, a NaN b by falling through.
template <typename T>
struct Min {
  T operator()(T a, T b) const {
    return (a < b || a != a) ? a : b;
  }  // NOLINT(misc-redundant-expression)
};
template <typename T>
struct Max {
  T operator()(T a, T b) const {
    return (a > b || a != a) ? a : b;
  }  // NOLINT(misc-redundant-expression)
};

template <typename T, typename Op>
KC_INLINE void Loop(T* __restrict dst, const T* __restrict src, size_t N, Op op) {
  for (size_t i = 0; i < N; ++i) dst[i] = op(dst[i], src[i]);
}

// bf16: widen both operands, combine in fp32, round once.
template <typename Op>
KC_INLINE void LoopBf16(Bf16* __restrict dst, const Bf16* __restrict src, size_t N, Op op) {
  for (size_t i = 0; i < N; ++i) {
    dst[i] = FloatToBf16(op(Bf16ToFloat(dst[i]), Bf16ToFloat(src[i])));
  }
}

template <typename T>
KC_INLINE void ReduceTyped(ReduceOp op, void* dst, const void* src, size_t N) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  switch (op) {
    case ReduceOp::kSum:
      return Loop(d, s, N, Sum<T>());
    case ReduceOp::kProd:
      return Loop(d, s, N, Prod<T>());
    case ReduceOp::kMin:
      return Loop(d, s, N, Min<T>());
    case ReduceOp::kMax:
      return Loop(d, s, N, Max<T>());
  }
}

KC_INLINE void ReduceBf16(ReduceOp op, void* dst, const void* src, size_t N) {
  Bf16* d = static_cast<Bf16*>(dst);
  const Bf16* s = static_cast<const Bf16*>(src);
  switch (op) {
    case ReduceOp::kSum:
      return LoopBf16(d, s, N, Sum<float>());
    case ReduceOp::kProd:
      return LoopBf16(d, s, N, Prod<float>());
    case ReduceOp::kMin:
      return LoopBf16(d, s, N, Min<float>());
    case ReduceOp::kMax:
      return LoopBf16(d, s, N, Max<float>());
  }
}

}  // namespace

KC_VECTOR_CLONES void ReduceInto(DataType type, ReduceOp op, void* dst, const void* src, size_t N) {
  switch (type) {
    case DataType::kF32:
      return ReduceTyped<float>(op, dst, src, N);
    case DataType::kF64:
      return ReduceTyped<double>(op, dst, src, N);
    case DataType::kI32:
      return ReduceTyped<int32_t>(op, dst, src, N);
    case DataType::kI64:
      return ReduceTyped<int64_t>(op, dst, src, N);
    case DataType::kBf16:
      return ReduceBf16(op, dst, src, N);
  }
}

KC_VECTOR_CLONES void Scale(float* __restrict x, size_t N, float alpha) {
  for (size_t i = 0; i < N; ++i) x[i] *= alpha;
}
KC_VECTOR_CLONES void Scale(double* __restrict x, size_t N, double alpha) {
  for (size_t i = 0; i < N; ++i) x[i] *= alpha;
}
KC_VECTOR_CLONES void Scale(Bf16* __restrict x, size_t N, float alpha) {
  for (size_t i = 0; i < N; ++i) x[i] = FloatToBf16(Bf16ToFloat(x[i]) * alpha);
}

KC_VECTOR_CLONES void Axpy(float* __restrict y, float alpha, const float* __restrict x, size_t N) {
  for (size_t i = 0; i < N; ++i) y[i] += alpha * x[i];
}
KC_VECTOR_CLONES void Axpy(double* __restrict y, double alpha, const double* __restrict x,
                           size_t N) {
  for (size_t i = 0; i < N; ++i) y[i] += alpha * x[i];
}
KC_VECTOR_CLONES void Axpy(Bf16* __restrict y, float alpha, const Bf16* __restrict x, size_t N) {
  for (size_t i = 0; i < N; ++i) {
    y[i] = FloatToBf16(Bf16ToFloat(y[i]) + alpha * Bf16ToFloat(x[i]));
  }
}

KC_VECTOR_CLONES void ConvertF32ToBf16(Bf16* __restrict dst, const float* __restrict src,
                                       size_t N) {
  for (size_t i = 0; i < N; ++i) dst[i] = FloatToBf16(src[i]);
}
KC_VECTOR_CLONES void ConvertBf16ToF32(float* __restrict dst, const Bf16* __restrict src,
                                       size_t N) {
  for (size_t i = 0; i < N; ++i) dst[i] = Bf16ToFloat(src[i]);
}

}  // namespace kc::hal::cpu
