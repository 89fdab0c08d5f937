// Plain reference loops for every kernel of hal/kernels.h: the oracle each backend (CPU
// now, CUDA later) is compared against in tests (STYLE.md §9). Host memory only, scalar
// loops written for clarity rather than speed, and bf16 rounding derived independently of
// FloatToBf16 (by comparing the two neighbouring bf16 values).
#pragma once

#include <cstdint>
#include <span>

#include "hal/compute.h"
#include "hal/kernels.h"

namespace kc::hal::reference {

// hal::Sgemm on host memory, naive triple loop accumulating in double. Leading dimensions
// are explicit (> 0). Same conventions: C is not read when beta == 0; A and B are not read
// when alpha == 0 or K == 0.
struct SgemmArgs {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  std::span<const float> a;  // (M, K) or (K, M), row stride lda
  int64_t lda = 0;
  std::span<const float> b;  // (K, N) or (N, K), row stride ldb
  int64_t ldb = 0;
  float beta = 0.0f;
  std::span<float> c;  // (M, N), row stride ldc
  int64_t ldc = 0;
};
void Sgemm(const SgemmArgs& args);
// batch_count calls of Sgemm, matrix i at offset i * stride_x of each span.
void SgemmStridedBatched(const SgemmArgs& args, int64_t batch_count, int64_t stride_a,
                         int64_t stride_b, int64_t stride_c);

// Round to nearest, ties to even, by picking the nearer of the two bf16 neighbours of f
// (the even one on a tie; beyond the largest finite bf16 the upper neighbour is inf at
// 2^128); NaN keeps its sign and becomes quiet.
Bf16 RoundToBf16(float f);

// dst[i] = op(dst[i], src[i]); semantics as hal::ReduceInto. REQUIRES: equal sizes.
void ReduceInto(std::span<float> dst, std::span<const float> src, ReduceOp op);
void ReduceInto(std::span<double> dst, std::span<const double> src, ReduceOp op);
void ReduceInto(std::span<int32_t> dst, std::span<const int32_t> src, ReduceOp op);
void ReduceInto(std::span<int64_t> dst, std::span<const int64_t> src, ReduceOp op);
void ReduceInto(std::span<Bf16> dst, std::span<const Bf16> src, ReduceOp op);

void Scale(std::span<float> x, float alpha);
void Scale(std::span<double> x, double alpha);
void Scale(std::span<Bf16> x, float alpha);

void Axpy(std::span<float> y, float alpha, std::span<const float> x);
void Axpy(std::span<double> y, double alpha, std::span<const double> x);
void Axpy(std::span<Bf16> y, float alpha, std::span<const Bf16> x);

void ConvertF32ToBf16(std::span<Bf16> dst, std::span<const float> src);
void ConvertBf16ToF32(std::span<float> dst, std::span<const Bf16> src);

}  // namespace kc::hal::reference
