// Device kernels every layer above needs: sgemm (plain and strided-batched), the
// element-wise reduction behind collectives, and the few vector ops optimisers and gradient
// averaging use. Model kernels (LayerNorm, attention, GELU, ...) are L3's, not here
// (docs/design/kernels.md says why).
//
// Every kernel takes the Stream it runs on and writes only into buffers the caller
// provides; none allocates. Arguments are checked before anything is enqueued: a negative
// dimension, a too-small leading dimension, mismatched sizes, a null pointer with a nonzero
// count, memory of another device than the stream's, overlapping input and output, or an
// unknown enum value returns kInvalidArgument and touches nothing. Execution errors of an
// asynchronous backend surface at Synchronize(stream).
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "base/status.h"
#include "hal/compute.h"

namespace kc::hal {

enum class Transpose : uint8_t { kNo = 0, kYes = 1 };

// Single-precision GEMM, row-major: C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
// M, N, K: op(A) is (M, K), op(B) is (K, N), C is (M, N). Row r of a matrix X starts at
// element r * ldx; a leading dimension of 0 means tight (the row width). As in BLAS, C is not
// read when beta == 0 (NaNs there do not propagate), and A and B are not read when
// alpha == 0 or K == 0.
struct SgemmOptions {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  DeviceSpan<const float> a;  // (M, K) rows of stride lda; (K, M) when trans_a
  int64_t lda = 0;            // >= the row width: K, or M when trans_a
  DeviceSpan<const float> b;  // (K, N) rows of stride ldb; (N, K) when trans_b
  int64_t ldb = 0;            // >= N, or K when trans_b
  float beta = 0.0f;
  DeviceSpan<float> c;  // (M, N) rows of stride ldc; must not overlap a or b
  int64_t ldc = 0;      // >= N
};
// Dimensions and leading dimensions must fit the BLAS index type (int32): kInvalidArgument
// beyond. Uses the device's threads (ComputeDeviceOptions::threads).
Status Sgemm(Stream& stream, const SgemmOptions& options);

// batch_count independent GEMMs of the same shape: matrix i of X starts at element
// i * stride_x of the span in `gemm`. stride_a or stride_b may be 0 (one matrix shared by
// the whole batch); stride_c must keep the C matrices disjoint (>= (M - 1) * ldc + N) when
// batch_count > 1.
struct SgemmStridedBatchedOptions {
  SgemmOptions gemm;  // shapes of one problem; the spans cover the whole batch
  int64_t batch_count = 1;
  int64_t stride_a = 0;
  int64_t stride_b = 0;
  int64_t stride_c = 0;
};
Status SgemmStridedBatched(Stream& stream, const SgemmStridedBatchedOptions& options);

// The product of SgemmStridedBatched with a choice of element types: A and B both f32 with an
// f32 C, or both bf16 with a bf16 or f32 C (mixed precision: bf16 operands, fp32 weight
// gradients). Products accumulate in fp32 (bf16 operands widen exactly); a bf16 C is rounded
// once. Spans are bytes; counts, leading dimensions and strides are in elements of their
// operand's type. Checks as SgemmStridedBatched, plus kInvalidArgument for another type
// combination. The CPU backend runs f32 only: bf16 returns kUnimplemented there (bf16
// products are for devices with bf16 matrix units).
struct GemmOptions {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  DataType ab_type = DataType::kF32;  // of A and B
  DeviceSpan<const std::byte> a;      // (M, K) rows of stride lda; (K, M) when trans_a
  int64_t lda = 0;
  DeviceSpan<const std::byte> b;  // (K, N) rows of stride ldb; (N, K) when trans_b
  int64_t ldb = 0;
  float beta = 0.0f;
  DataType c_type = DataType::kF32;
  DeviceSpan<std::byte> c;  // (M, N) rows of stride ldc; must not overlap a or b
  int64_t ldc = 0;
  int64_t batch_count = 1;
  int64_t stride_a = 0;
  int64_t stride_b = 0;
  int64_t stride_c = 0;
};
Status Gemm(Stream& stream, const GemmOptions& options);

// The reduction of collectives: dst[i] = op(dst[i], src[i]).
enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMin = 2, kMax = 3 };
std::string_view ReduceOpName(ReduceOp op);  // "sum", "prod", "min", "max"

// For every DataType. Floating point: min and max propagate NaN (either operand NaN gives
// NaN). Integers: sum and prod wrap around modulo 2^bits (two's complement). Bf16: both
// operands are widened to fp32, combined in fp32, and rounded back to nearest-even once
// (FloatToBf16). dst and src hold the same number of elements and must not overlap.
struct ReduceIntoOptions {
  DataType type = DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  DeviceSpan<std::byte> dst;        // (N) elements of `type`, aligned for it
  DeviceSpan<const std::byte> src;  // (N)
};
Status ReduceInto(Stream& stream, const ReduceIntoOptions& options);

template <typename T>
requires(!std::is_const_v<T>) Status
    ReduceInto(Stream& stream, DeviceSpan<T> dst, DeviceSpan<const std::type_identity_t<T>> src,
               ReduceOp op) {
  return ReduceInto(
      stream,
      {.type = DataTypeOf<T>::value, .op = op, .dst = AsWritableBytes(dst), .src = AsBytes(src)});
}

// x[i] = alpha * x[i]: averaging after a sum. fp32 and bf16 compute in fp32 (bf16 rounds
// once per element), fp64 in fp64.
Status Scale(Stream& stream, DeviceSpan<float> x, float alpha);
Status Scale(Stream& stream, DeviceSpan<double> x, double alpha);
Status Scale(Stream& stream, DeviceSpan<Bf16> x, float alpha);

// y[i] = y[i] + alpha * x[i]. Precision as Scale. x and y have the same size and must not
// overlap.
Status Axpy(Stream& stream, DeviceSpan<float> y, float alpha, DeviceSpan<const float> x);
Status Axpy(Stream& stream, DeviceSpan<double> y, double alpha, DeviceSpan<const double> x);
Status Axpy(Stream& stream, DeviceSpan<Bf16> y, float alpha, DeviceSpan<const Bf16> x);

// x[i] = value.
Status Fill(Stream& stream, DeviceSpan<float> x, float value);
Status Fill(Stream& stream, DeviceSpan<double> x, double value);
Status Fill(Stream& stream, DeviceSpan<int32_t> x, int32_t value);
Status Fill(Stream& stream, DeviceSpan<int64_t> x, int64_t value);
Status Fill(Stream& stream, DeviceSpan<Bf16> x, Bf16 value);

// dst[i] = FloatToBf16(src[i]) (round to nearest even) and dst[i] = Bf16ToFloat(src[i])
// (exact). Same sizes; no overlap.
Status ConvertF32ToBf16(Stream& stream, DeviceSpan<Bf16> dst, DeviceSpan<const float> src);
Status ConvertBf16ToF32(Stream& stream, DeviceSpan<float> dst, DeviceSpan<const Bf16> src);

}  // namespace kc::hal
