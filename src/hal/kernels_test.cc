// Every kernel against its reference loop (hal/reference_kernels.h), with the tolerance
// stated next to each comparison, plus the argument checks.
#include "hal/kernels.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hal/compute.h"
#include "hal/reference_kernels.h"

namespace kc::hal {
namespace {

constexpr uint32_t kSeed = 20240611;  // fixed: every run draws the same data

std::unique_ptr<ComputeDevice> OpenCpu(int threads = 0) {
  cpu_set_t set;
  CPU_ZERO(&set);
  KC_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
  DeviceDescriptor d;
  d.id = "test/cpu0";
  d.kind = DeviceKind::kCpu;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) d.cpus.push_back(i);
  }
  Result<std::unique_ptr<ComputeDevice>> device = OpenComputeDevice(d, {.threads = threads});
  KC_CHECK(device.ok()) << device.status();
  return std::move(device).value();
}

// Host vectors double as CPU device memory.
template <typename T>
DeviceSpan<T> On(const ComputeDevice& device, std::vector<T>& v) {
  return DeviceSpan<T>(v.data(), v.size(), device.id());
}
template <typename T>
DeviceSpan<const T> OnConst(const ComputeDevice& device, const std::vector<T>& v) {
  return DeviceSpan<const T>(v.data(), v.size(), device.id());
}

std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ---------------------------------------------------------------------------------------
// Sgemm. Tolerance: the standard forward error bound of an fp32 dot product of length K,
// |C - C_ref| <= (K + 2) * FLT_EPSILON * (|alpha| * sum_p |A_ip| |B_pj| + |beta| |C_ij|),
// against a reference that accumulates in double.

struct GemmCase {
  std::string name;
  int64_t m, n, k;
  Transpose ta = Transpose::kNo;
  Transpose tb = Transpose::kNo;
  float alpha = 1.0f;
  float beta = 0.0f;
  int64_t pad_a = 0;  // leading dimension = row width + pad (0: pass 0, i.e. tight)
  int64_t pad_b = 0;
  int64_t pad_c = 0;
  bool nan_in_c = false;  // beta == 0 must not read C
};

std::ostream& operator<<(std::ostream& os, const GemmCase& c) { return os << c.name; }

struct Matrix {
  int64_t rows, cols, ld;
  std::vector<float> data;
};

// rows x cols with row stride cols + pad; the padding holds NaN so a kernel reading it shows.
Matrix MakeMatrix(std::mt19937& rng, int64_t rows, int64_t cols, int64_t pad, int64_t batch = 1) {
  Matrix m{rows, cols, std::max<int64_t>(1, cols + pad), {}};
  m.data.assign(static_cast<size_t>(batch * rows * m.ld), std::nanf(""));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) m.data[(b * rows + r) * m.ld + c] = dist(rng);
    }
  }
  return m;
}

std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::isnan(x) ? x : std::fabs(x);
  return v;
}

// Checks got against the reference, element by element, over batch matrices of C; padding
// of C (its NaNs) must be untouched.
void ExpectGemmClose(const GemmCase& g, const Matrix& a, const Matrix& b, const Matrix& c0,
                     const std::vector<float>& got, int64_t batch = 1) {
  reference::SgemmArgs args{.trans_a = g.ta,
                            .trans_b = g.tb,
                            .m = g.m,
                            .n = g.n,
                            .k = g.k,
                            .alpha = g.alpha,
                            .a = a.data,
                            .lda = a.ld,
                            .b = b.data,
                            .ldb = b.ld,
                            .beta = g.beta,
                            .c = {},
                            .ldc = c0.ld};
  const int64_t sa = a.rows * a.ld, sb = b.rows * b.ld, sc = c0.rows * c0.ld;
  std::vector<float> want = c0.data;
  args.c = want;
  reference::SgemmStridedBatched(args, batch, sa, sb, sc);
  // The bound's magnitudes: the same product on absolute values.
  const std::vector<float> abs_a = Abs(a.data), abs_b = Abs(b.data);
  std::vector<float> mag = Abs(c0.data);
  args.a = abs_a;
  args.b = abs_b;
  args.alpha = std::fabs(g.alpha);
  args.beta = std::fabs(g.beta);
  args.c = mag;
  reference::SgemmStridedBatched(args, batch, sa, sb, sc);
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < c0.ld; ++j) {
        const size_t at = static_cast<size_t>(bi * sc + i * c0.ld + j);
        if (j >= g.n) {  // padding
          ASSERT_TRUE(std::isnan(got[at]))
              << "padding written at batch " << bi << " (" << i << ", " << j << ")";
          continue;
        }
        const double tol = (g.k + 2) * double{FLT_EPSILON} * mag[at] + FLT_MIN;
        ASSERT_FALSE(std::isnan(got[at])) << "batch " << bi << " (" << i << ", " << j << ")";
        ASSERT_LE(std::fabs(double{got[at]} - double{want[at]}), tol)
            << "batch " << bi << " (" << i << ", " << j << ") got " << got[at] << " want "
            << want[at];
      }
    }
  }
}

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesTheReference) {
  const GemmCase& g = GetParam();
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  const bool ta = g.ta == Transpose::kYes, tb = g.tb == Transpose::kYes;
  const Matrix a = MakeMatrix(rng, ta ? g.k : g.m, ta ? g.m : g.k, g.pad_a);
  const Matrix b = MakeMatrix(rng, tb ? g.n : g.k, tb ? g.k : g.n, g.pad_b);
  Matrix c0 = MakeMatrix(rng, g.m, g.n, g.pad_c);
  if (g.nan_in_c) {
    for (float& x : c0.data) x = std::nanf("");
  }
  auto device = OpenCpu();
  std::vector<float> c = c0.data;
  const Status s = Sgemm(device->default_stream(), {.trans_a = g.ta,
                                                    .trans_b = g.tb,
                                                    .m = g.m,
                                                    .n = g.n,
                                                    .k = g.k,
                                                    .alpha = g.alpha,
                                                    .a = OnConst(*device, a.data),
                                                    .lda = g.pad_a == 0 ? 0 : a.ld,
                                                    .b = OnConst(*device, b.data),
                                                    .ldb = g.pad_b == 0 ? 0 : b.ld,
                                                    .beta = g.beta,
                                                    .c = On(*device, c),
                                                    .ldc = g.pad_c == 0 ? 0 : c0.ld});
  ASSERT_TRUE(s.ok()) << s;
  if (g.nan_in_c) {
    // c0 is all NaN; the reference treats it like the kernel (beta == 0: not read).
    for (float& x : c0.data) x = 0.0f;
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = g.n; j < c0.ld; ++j) c0.data[i * c0.ld + j] = std::nanf("");
    }
  }
  ExpectGemmClose(g, a, b, c0, c);
}

constexpr Transpose N = Transpose::kNo;
constexpr Transpose T = Transpose::kYes;

INSTANTIATE_TEST_SUITE_P(
    Gemm, GemmTest,
    ::testing::Values(
        GemmCase{"one", 1, 1, 1}, GemmCase{"odd_7x13x5", 7, 13, 5},
        GemmCase{"odd_64x33x17", 64, 33, 17}, GemmCase{"trans_a", 7, 13, 5, T, N},
        GemmCase{"trans_b", 7, 13, 5, N, T}, GemmCase{"trans_ab", 7, 13, 5, T, T},
        GemmCase{"trans_ab_64x33x17", 64, 33, 17, T, T},
        GemmCase{"trans_a_64x33x17", 64, 33, 17, T, N},
        GemmCase{"alpha_beta", 7, 13, 5, N, N, 2.5f, -0.5f},
        GemmCase{"alpha_beta_trans_b", 64, 33, 17, N, T, -1.25f, 0.75f},
        GemmCase{"wide_leading_dims", 7, 13, 5, N, N, 1.0f, 1.0f, 3, 5, 7},
        GemmCase{"wide_leading_dims_trans", 64, 33, 17, T, T, 0.5f, 2.0f, 1, 9, 4},
        GemmCase{"beta_zero_ignores_nan_c", 7, 13, 5, N, N, 1.0f, 0.0f, 0, 0, 2, true},
        GemmCase{"k_zero_scales_c", 7, 13, 0, N, N, 1.0f, 0.5f},
        GemmCase{"alpha_zero_scales_c", 7, 13, 5, N, N, 0.0f, -2.0f}, GemmCase{"m_zero", 0, 13, 5},
        GemmCase{"n_zero", 7, 0, 5}, GemmCase{"threaded_256", 256, 256, 256, N, N, 1.0f, 1.0f},
        GemmCase{"threaded_255x257x129_trans", 255, 257, 129, T, T, 1.0f, 0.0f, 2, 2, 2}),
    [](const ::testing::TestParamInfo<GemmCase>& info) { return info.param.name; });

TEST(GemmBatchedTest, EachMatrixMatchesTheReference) {
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  const int64_t batch = 3;
  const GemmCase g{"batched", 9, 11, 6, N, T, 1.5f, 0.5f, 2, 1, 3};
  const Matrix a = MakeMatrix(rng, g.m, g.k, g.pad_a, batch);
  const Matrix b = MakeMatrix(rng, g.n, g.k, g.pad_b, batch);
  const Matrix c0 = MakeMatrix(rng, g.m, g.n, g.pad_c, batch);
  auto device = OpenCpu();
  std::vector<float> c = c0.data;
  const Status s =
      SgemmStridedBatched(device->default_stream(), {.gemm = {.trans_a = g.ta,
                                                              .trans_b = g.tb,
                                                              .m = g.m,
                                                              .n = g.n,
                                                              .k = g.k,
                                                              .alpha = g.alpha,
                                                              .a = OnConst(*device, a.data),
                                                              .lda = a.ld,
                                                              .b = OnConst(*device, b.data),
                                                              .ldb = b.ld,
                                                              .beta = g.beta,
                                                              .c = On(*device, c),
                                                              .ldc = c0.ld},
                                                     .batch_count = batch,
                                                     .stride_a = a.rows * a.ld,
                                                     .stride_b = b.rows * b.ld,
                                                     .stride_c = c0.rows * c0.ld});
  ASSERT_TRUE(s.ok()) << s;
  ExpectGemmClose(g, a, b, c0, c, batch);
}

TEST(GemmBatchedTest, StrideZeroSharesOneMatrixAcrossTheBatch) {
  std::mt19937 rng(kSeed);
  const int64_t batch = 4, m = 5, n = 6, k = 7;
  const std::vector<float> a = RandomFloats(rng, m * k);  // one A for every problem
  const std::vector<float> b = RandomFloats(rng, batch * k * n);
  std::vector<float> c(batch * m * n, 0.0f);
  auto device = OpenCpu();
  ASSERT_TRUE(SgemmStridedBatched(device->default_stream(), {.gemm = {.m = m,
                                                                      .n = n,
                                                                      .k = k,
                                                                      .a = OnConst(*device, a),
                                                                      .b = OnConst(*device, b),
                                                                      .c = On(*device, c)},
                                                             .batch_count = batch,
                                                             .stride_a = 0,
                                                             .stride_b = k * n,
                                                             .stride_c = m * n})
                  .ok());
  std::vector<float> want(batch * m * n, 0.0f);
  reference::SgemmStridedBatched(
      {.m = m, .n = n, .k = k, .a = a, .lda = k, .b = b, .ldb = n, .c = want, .ldc = n}, batch, 0,
      k * n, m * n);
  for (size_t i = 0; i < want.size(); ++i) {
    // K = 7 terms of magnitude <= 1: (K + 2) * eps * K bounds the error.
    EXPECT_NEAR(c[i], want[i], 9 * 7 * FLT_EPSILON) << i;
  }
}

TEST(GemmBatchedTest, BatchCountZeroDoesNothing) {
  auto device = OpenCpu();
  std::vector<float> c = {42.0f};
  EXPECT_TRUE(
      SgemmStridedBatched(device->default_stream(),
                          {.gemm = {.m = 1, .n = 1, .k = 1, .c = On(*device, c)}, .batch_count = 0})
          .ok());
  EXPECT_EQ(c[0], 42.0f);
}

// ---------------------------------------------------------------------------------------
// Argument checks: kInvalidArgument, and nothing written.

class KernelValidationTest : public ::testing::Test {
 protected:
  KernelValidationTest() : device_(OpenCpu()), a_(64, 1.0f), b_(64, 1.0f), c_(64, 7.0f) {}

  // A valid 4x4x4 problem the tests break one field of.
  SgemmOptions Valid() {
    return {.m = 4,
            .n = 4,
            .k = 4,
            .a = OnConst(*device_, a_),
            .b = OnConst(*device_, b_),
            .c = On(*device_, c_)};
  }
  void ExpectRefused(const SgemmOptions& o) {
    EXPECT_EQ(Sgemm(stream(), o).code(), ErrorCode::kInvalidArgument);
    for (float x : c_) ASSERT_EQ(x, 7.0f) << "refused call wrote C";
  }
  Stream& stream() { return device_->default_stream(); }

  std::unique_ptr<ComputeDevice> device_;
  std::vector<float> a_, b_, c_;
};

TEST_F(KernelValidationTest, TheValidProblemRuns) {
  ASSERT_TRUE(Sgemm(stream(), Valid()).ok());
  EXPECT_EQ(c_[0], 4.0f);
}

// Gemm is Sgemm with typed operands: f32 runs on the CPU exactly as Sgemm does; bf16 is
// checked the same way, then refused by a backend without bf16 products.
TEST_F(KernelValidationTest, GemmInF32GivesSgemmsResult) {
  ASSERT_TRUE(Sgemm(stream(), Valid()).ok());
  const std::vector<float> expected = c_;
  std::fill(c_.begin(), c_.end(), 7.0f);
  const SgemmOptions v = Valid();
  ASSERT_TRUE(
      Gemm(
          stream(),
          {.m = 4, .n = 4, .k = 4, .a = AsBytes(v.a), .b = AsBytes(v.b), .c = AsWritableBytes(v.c)})
          .ok());
  EXPECT_EQ(c_, expected);
}

TEST_F(KernelValidationTest, GemmRefusesMixedTypesAndChecksSpansInTheirElements) {
  const SgemmOptions v = Valid();
  GemmOptions g{.m = 4,
                .n = 4,
                .k = 4,
                .a = AsBytes(v.a),
                .b = AsBytes(v.b),
                .c_type = DataType::kBf16,
                .c = AsWritableBytes(v.c)};
  EXPECT_EQ(Gemm(stream(), g).code(), ErrorCode::kInvalidArgument);  // f32 operands, bf16 C
  g.ab_type = DataType::kF64;
  g.c_type = DataType::kF64;
  EXPECT_EQ(Gemm(stream(), g).code(), ErrorCode::kInvalidArgument);
  // bf16 operands of 4x4 need 16 elements (32 bytes): 24 bytes are too few.
  g.ab_type = DataType::kBf16;
  g.c_type = DataType::kF32;
  g.a = AsBytes(v.a).first(24);
  EXPECT_EQ(Gemm(stream(), g).code(), ErrorCode::kInvalidArgument);
  for (float x : c_) ASSERT_EQ(x, 7.0f) << "refused call wrote C";
}

TEST_F(KernelValidationTest, GemmInBf16IsUnimplementedOnTheCpu) {
  const SgemmOptions v = Valid();
  const GemmOptions g{.m = 4,
                      .n = 4,
                      .k = 4,
                      .ab_type = DataType::kBf16,
                      .a = AsBytes(v.a),
                      .b = AsBytes(v.b),
                      .c_type = DataType::kF32,
                      .c = AsWritableBytes(v.c)};
  EXPECT_EQ(Gemm(stream(), g).code(), ErrorCode::kUnimplemented);
  for (float x : c_) ASSERT_EQ(x, 7.0f) << "refused call wrote C";
}

TEST_F(KernelValidationTest, SgemmRefusesNegativeAndOversizedDims) {
  for (int64_t SgemmOptions::*dim : {&SgemmOptions::m, &SgemmOptions::n, &SgemmOptions::k}) {
    SgemmOptions o = Valid();
    o.*dim = -1;
    ExpectRefused(o);
    o.*dim = int64_t{INT_MAX} + 1;
    ExpectRefused(o);
  }
}

TEST_F(KernelValidationTest, SgemmRefusesTooSmallLeadingDims) {
  SgemmOptions o = Valid();
  o.lda = 3;
  ExpectRefused(o);
  o = Valid();
  o.ldb = -4;
  ExpectRefused(o);
  o = Valid();
  o.ldc = 2;
  ExpectRefused(o);
  o = Valid();
  o.trans_a = Transpose::kYes;
  o.m = 8;  // A is (K, M) = (4, 8): lda must be >= 8, and the span holds 64 >= 3 * 8 + 8
  o.c = On(*device_, c_);
  o.lda = 6;
  ExpectRefused(o);
  o.lda = int64_t{INT_MAX} + 1;
  ExpectRefused(o);
}

TEST_F(KernelValidationTest, SgemmRefusesSpansTooSmallNullOrElsewhere) {
  SgemmOptions o = Valid();
  o.a = o.a.first(15);
  ExpectRefused(o);
  o = Valid();
  o.lda = 16;  // now A needs 3 * 16 + 4 = 52 <= 64 elements: fine
  ASSERT_TRUE(Sgemm(stream(), o).ok());
  for (float& x : c_) x = 7.0f;
  o.lda = 21;  // 3 * 21 + 4 = 67 > 64
  ExpectRefused(o);
  o = Valid();
  o.b = DeviceSpan<const float>(nullptr, 16, device_->id());
  ExpectRefused(o);
  o = Valid();
  o.a = DeviceSpan<const float>(a_.data(), a_.size(), DeviceId{DeviceKind::kCpu, 9});
  ExpectRefused(o);
  o = Valid();
  o.trans_b = static_cast<Transpose>(7);
  ExpectRefused(o);
}

TEST_F(KernelValidationTest, SgemmRefusesCOverlappingAOrB) {
  SgemmOptions o = Valid();
  o.a = DeviceSpan<const float>(c_.data() + 8, 16, device_->id());
  ExpectRefused(o);
}

TEST_F(KernelValidationTest, BatchedRefusesNegativeCountsAndOverlappingOutputs) {
  SgemmStridedBatchedOptions o{.gemm = Valid(), .batch_count = -1};
  EXPECT_EQ(SgemmStridedBatched(stream(), o).code(), ErrorCode::kInvalidArgument);
  o = {.gemm = Valid(), .batch_count = 2, .stride_a = 16, .stride_b = 16, .stride_c = 8};
  EXPECT_EQ(SgemmStridedBatched(stream(), o).code(), ErrorCode::kInvalidArgument);
  o.stride_c = 16;
  o.stride_a = -16;
  EXPECT_EQ(SgemmStridedBatched(stream(), o).code(), ErrorCode::kInvalidArgument);
  o.stride_a = 64;  // batch 2 needs 64 + 16 elements of A
  EXPECT_EQ(SgemmStridedBatched(stream(), o).code(), ErrorCode::kInvalidArgument);
  o.stride_a = INT64_MAX;
  EXPECT_EQ(SgemmStridedBatched(stream(), o).code(), ErrorCode::kInvalidArgument);
  for (float x : c_) ASSERT_EQ(x, 7.0f);
}

TEST_F(KernelValidationTest, ElementwiseRefusesMismatchesNullsOverlapsAndBadEnums) {
  std::vector<float> x(8, 1.0f), y(8, 2.0f), shorter(7, 0.0f);
  const DeviceSpan<float> dy = On(*device_, y);
  EXPECT_EQ(ReduceInto(stream(), dy, On(*device_, shorter), ReduceOp::kSum).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(ReduceInto(stream(), dy, dy, ReduceOp::kSum).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ReduceInto(stream(), dy, On(*device_, x), static_cast<ReduceOp>(9)).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(ReduceInto(stream(), DeviceSpan<float>(nullptr, 8, device_->id()), On(*device_, x),
                       ReduceOp::kSum)
                .code(),
            ErrorCode::kInvalidArgument);
  // The type-erased form: unknown type, a partial element, a misaligned pointer.
  ReduceIntoOptions erased{.type = static_cast<DataType>(42),
                           .op = ReduceOp::kSum,
                           .dst = AsWritableBytes(dy),
                           .src = AsBytes(On(*device_, x))};
  EXPECT_EQ(ReduceInto(stream(), erased).code(), ErrorCode::kInvalidArgument);
  erased.type = DataType::kF32;
  erased.dst = erased.dst.first(30);
  erased.src = erased.src.first(30);
  EXPECT_EQ(ReduceInto(stream(), erased).code(), ErrorCode::kInvalidArgument);
  erased.dst = AsWritableBytes(dy).subspan(2, 16);
  erased.src = AsBytes(On(*device_, x)).subspan(0, 16);
  EXPECT_EQ(ReduceInto(stream(), erased).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Axpy(stream(), dy, 1.0f, On(*device_, shorter)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Scale(stream(), DeviceSpan<float>(nullptr, 1, device_->id()), 2.0f).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      Fill(stream(), DeviceSpan<float>(y.data(), 8, DeviceId{DeviceKind::kCuda, 0}), 0.0f).code(),
      ErrorCode::kInvalidArgument);
  std::vector<Bf16> half(7);
  EXPECT_EQ(ConvertF32ToBf16(stream(), On(*device_, half), On(*device_, x)).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(y, std::vector<float>(8, 2.0f)) << "a refused call wrote its output";
  // Empty spans, even null ones, are fine.
  EXPECT_TRUE(
      ReduceInto(stream(), DeviceSpan<float>(), DeviceSpan<const float>(), ReduceOp::kMax).ok());
}

// ---------------------------------------------------------------------------------------
// ReduceInto: every DataType x ReduceOp x count. Tolerance: exact. Each element is one
// IEEE operation (or one wrapping integer operation) in both implementations; NaN equals
// NaN, and +0 equals -0 (min/max of zeros may return either).

template <typename T>
bool SameValue(T got, T want) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return SameValue(Bf16ToFloat(got), Bf16ToFloat(want));
  } else if constexpr (std::is_floating_point_v<T>) {
    return (std::isnan(got) && std::isnan(want)) || got == want;
  } else {
    return got == want;
  }
}

template <typename T>
std::vector<T> RandomValues(std::mt19937& rng, size_t n) {
  std::vector<T> v(n);
  if constexpr (std::is_integral_v<T>) {
    // Mostly small (products stay meaningful), some huge (sums and products wrap).
    std::uniform_int_distribution<T> small(-100, 100);
    std::uniform_int_distribution<T> any(std::numeric_limits<T>::min(),
                                         std::numeric_limits<T>::max());
    for (size_t i = 0; i < n; ++i) v[i] = i % 5 == 4 ? any(rng) : small(rng);
  } else {
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    for (size_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      if constexpr (std::is_same_v<T, Bf16>) {
        v[i] = FloatToBf16(f);
      } else {
        v[i] = static_cast<T>(f) / T(3);  // fill the mantissa
      }
    }
    // Specials at fixed spots when the vector is long enough.
    const float specials[] = {std::nanf(""),
                              -std::nanf(""),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              0.0f,
                              -0.0f,
                              std::numeric_limits<float>::denorm_min(),
                              3.0e38f};
    for (size_t i = 0; i < std::size(specials) && 11 * i + 3 < n; ++i) {
      if constexpr (std::is_same_v<T, Bf16>) {
        v[11 * i + 3] = FloatToBf16(specials[i]);
      } else {
        v[11 * i + 3] = static_cast<T>(specials[i]);
      }
    }
  }
  return v;
}

template <typename T>
class ElementwiseReduceTest : public ::testing::Test {};
using ReduceTypes = ::testing::Types<float, double, int32_t, int64_t, Bf16>;
TYPED_TEST_SUITE(ElementwiseReduceTest, ReduceTypes);

TYPED_TEST(ElementwiseReduceTest, EveryOpMatchesTheReferenceForEveryCount) {
  using T = TypeParam;
  auto device = OpenCpu();
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1003}, size_t{65541}}) {
      SCOPED_TRACE(std::string(ReduceOpName(op)) + " n=" + std::to_string(n));
      std::vector<T> dst = RandomValues<T>(rng, n);
      // src: shifted specials so NaN meets numbers, and numbers meet NaN.
      std::vector<T> src = RandomValues<T>(rng, n);
      if (n > 20) std::rotate(src.begin(), src.begin() + 5, src.end());
      std::vector<T> want = dst;
      reference::ReduceInto(std::span<T>(want), std::span<const T>(src), op);
      ASSERT_TRUE(
          ReduceInto(device->default_stream(), On(*device, dst), OnConst(*device, src), op).ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameValue(dst[i], want[i])) << "at " << i;
      }
    }
  }
}

TYPED_TEST(ElementwiseReduceTest, TheTypeErasedFormAgrees) {
  using T = TypeParam;
  auto device = OpenCpu();
  std::mt19937 rng(kSeed + 1);
  std::vector<T> dst = RandomValues<T>(rng, 333), src = RandomValues<T>(rng, 333);
  std::vector<T> want = dst;
  reference::ReduceInto(std::span<T>(want), std::span<const T>(src), ReduceOp::kSum);
  ASSERT_TRUE(ReduceInto(device->default_stream(), {.type = DataTypeOf<T>::value,
                                                    .op = ReduceOp::kSum,
                                                    .dst = AsWritableBytes(On(*device, dst)),
                                                    .src = AsBytes(OnConst(*device, src))})
                  .ok());
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_TRUE(SameValue(dst[i], want[i])) << i;
}

TEST(ElementwiseReduceSemanticsTest, MinMaxPropagateNanAndIntegersWrap) {
  auto device = OpenCpu();
  Stream& s = device->default_stream();
  const float nan = std::nanf("");
  std::vector<float> d = {nan, 1.0f, 2.0f}, src = {1.0f, nan, -3.0f};
  ASSERT_TRUE(ReduceInto(s, On(*device, d), OnConst(*device, src), ReduceOp::kMin).ok());
  EXPECT_TRUE(std::isnan(d[0]));
  EXPECT_TRUE(std::isnan(d[1]));
  EXPECT_EQ(d[2], -3.0f);
  std::vector<int32_t> i = {INT32_MAX, INT32_MIN}, j = {1, -1};
  ASSERT_TRUE(ReduceInto(s, On(*device, i), OnConst(*device, j), ReduceOp::kSum).ok());
  EXPECT_EQ(i, (std::vector<int32_t>{INT32_MIN, INT32_MAX}));
  std::vector<int64_t> p = {INT64_C(1) << 62}, q = {4};
  ASSERT_TRUE(ReduceInto(s, On(*device, p), OnConst(*device, q), ReduceOp::kProd).ok());
  EXPECT_EQ(p[0], 0);
  // bf16 sum rounds once, to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
  std::vector<Bf16> x = {FloatToBf16(1.0f)}, y = {FloatToBf16(0.00390625f)};
  ASSERT_TRUE(ReduceInto(s, On(*device, x), OnConst(*device, y), ReduceOp::kSum).ok());
  EXPECT_EQ(Bf16ToFloat(x[0]), 1.0f);
}

// ---------------------------------------------------------------------------------------
// bf16 rounding. Tolerance: exact (bitwise), against the reference's independent rule.

TEST(ElementwiseBf16Test, RoundsToNearestEvenOnTiesAndKeepsNan) {
  const auto round = [](uint32_t bits) { return FloatToBf16(std::bit_cast<float>(bits)).bits; };
  EXPECT_EQ(round(0x3F800000u), 0x3F80u);  // 1.0 exact
  EXPECT_EQ(round(0x3F808000u), 0x3F80u);  // tie, even stays
  EXPECT_EQ(round(0x3F818000u), 0x3F82u);  // tie, odd rounds up to even
  EXPECT_EQ(round(0x3F808001u), 0x3F81u);  // just above the tie
  EXPECT_EQ(round(0x3F807FFFu), 0x3F80u);  // just below
  EXPECT_EQ(round(0xBF818000u), 0xBF82u);  // negative ties away to even too
  EXPECT_EQ(round(0x7F7F7FFFu), 0x7F7Fu);  // largest that stays finite
  EXPECT_EQ(round(0x7F7F8000u), 0x7F80u);  // tie at the top: to even, which is inf
  EXPECT_EQ(round(0x7F800000u), 0x7F80u);  // inf
  EXPECT_EQ(round(0xFF800000u), 0xFF80u);  // -inf
  EXPECT_EQ(round(0x00000001u), 0x0000u);  // the smallest denormal rounds to 0
  EXPECT_EQ(round(0x80000000u), 0x8000u);  // -0 keeps its sign
  EXPECT_EQ(round(0x7FC00000u), 0x7FC0u);  // quiet NaN
  EXPECT_EQ(round(0x7F800001u), 0x7FC0u);  // signalling NaN, payload in the low bits: quiet
  EXPECT_EQ(round(0xFF812345u), 0xFFC1u);  // sign and upper payload kept
  EXPECT_EQ(round(0x7FFFFFFFu), 0x7FFFu);  // no carry into the sign
}

TEST(ElementwiseBf16Test, AgreesWithTheReferenceAcrossTheFloatRange) {
  // Every 251st bit pattern (17 million), plus each pattern's tie and neighbours.
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 251) {
    const uint32_t bits = static_cast<uint32_t>(u);
    for (uint32_t probe : {bits, (bits & 0xFFFF0000u) | 0x8000u, (bits & 0xFFFF0000u) | 0x7FFFu,
                           (bits & 0xFFFF0000u) | 0x8001u}) {
      const float f = std::bit_cast<float>(probe);
      const Bf16 got = FloatToBf16(f);
      const Bf16 want = reference::RoundToBf16(f);
      ASSERT_EQ(got.bits, want.bits) << std::hex << "bits=0x" << probe;
    }
  }
}

TEST(ElementwiseBf16Test, ConversionsMatchTheReference) {
  auto device = OpenCpu();
  std::mt19937 rng(kSeed);
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{100001}}) {
    SCOPED_TRACE(n);
    std::vector<float> f(n);
    std::uniform_int_distribution<uint32_t> bits;
    for (float& x : f) x = std::bit_cast<float>(bits(rng));  // any pattern, NaNs included
    std::vector<Bf16> got(n), want(n);
    ASSERT_TRUE(
        ConvertF32ToBf16(device->default_stream(), On(*device, got), OnConst(*device, f)).ok());
    reference::ConvertF32ToBf16(want, f);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i].bits, want[i].bits) << i;
    std::vector<float> back(n), back_want(n);
    ASSERT_TRUE(
        ConvertBf16ToF32(device->default_stream(), On(*device, back), OnConst(*device, got)).ok());
    reference::ConvertBf16ToF32(back_want, got);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(back_want[i])) << i;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Scale, Axpy, Fill. Tolerance: exact. The CPU loops and the reference both compile with
// FP_CONTRACT OFF (no FMA fusing on any ISA clone), so each element is the same IEEE
// operations. A backend that fuses (CUDA) states its own bound: one rounding of y + alpha x.

template <typename T>
class ElementwiseFloatTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double, Bf16>;
TYPED_TEST_SUITE(ElementwiseFloatTest, FloatTypes);

TYPED_TEST(ElementwiseFloatTest, ScaleAndAxpyMatchTheReference) {
  using T = TypeParam;
  using Alpha = std::conditional_t<std::is_same_v<T, double>, double, float>;
  auto device = OpenCpu();
  Stream& s = device->default_stream();
  std::mt19937 rng(kSeed);
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{4099}}) {
    SCOPED_TRACE(n);
    const Alpha alpha = Alpha(-0.3);
    std::vector<T> x = RandomValues<T>(rng, n);
    std::vector<T> want = x;
    ASSERT_TRUE(Scale(s, On(*device, x), alpha).ok());
    reference::Scale(std::span<T>(want), alpha);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameValue(x[i], want[i])) << "scale at " << i;

    std::vector<T> y = RandomValues<T>(rng, n), src = RandomValues<T>(rng, n);
    std::vector<T> y_want = y;
    ASSERT_TRUE(Axpy(s, On(*device, y), alpha, OnConst(*device, src)).ok());
    reference::Axpy(std::span<T>(y_want), alpha, std::span<const T>(src));
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameValue(y[i], y_want[i])) << "axpy at " << i;
  }
}

TEST(ElementwiseFillTest, FillsEveryType) {
  auto device = OpenCpu();
  Stream& s = device->default_stream();
  std::vector<float> f(13);
  std::vector<double> d(13);
  std::vector<int32_t> i(13);
  std::vector<int64_t> l(13);
  std::vector<Bf16> h(13);
  ASSERT_TRUE(Fill(s, On(*device, f), 1.5f).ok());
  ASSERT_TRUE(Fill(s, On(*device, d), -2.25).ok());
  ASSERT_TRUE(Fill(s, On(*device, i), -7).ok());
  ASSERT_TRUE(Fill(s, On(*device, l), INT64_MIN).ok());
  ASSERT_TRUE(Fill(s, On(*device, h), FloatToBf16(3.0f)).ok());
  EXPECT_EQ(f, std::vector<float>(13, 1.5f));
  EXPECT_EQ(d, std::vector<double>(13, -2.25));
  EXPECT_EQ(i, std::vector<int32_t>(13, -7));
  EXPECT_EQ(l, std::vector<int64_t>(13, INT64_MIN));
  EXPECT_EQ(h, std::vector<Bf16>(13, FloatToBf16(3.0f)));
  EXPECT_TRUE(Fill(s, On(*device, f).first(0), 9.0f).ok());
}

TEST(ElementwiseStreamTest, KernelsRunOnAnyStreamOfTheDeviceInOrder) {
  auto device = OpenCpu();
  Result<std::unique_ptr<Stream>> stream = device->CreateStream();
  ASSERT_TRUE(stream.ok());
  Stream& s = **stream;
  std::vector<float> acc(1000), one(1000);
  ASSERT_TRUE(Fill(s, On(*device, acc), 0.0f).ok());
  ASSERT_TRUE(Fill(s, On(*device, one), 1.0f).ok());
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(ReduceInto(s, On(*device, acc), OnConst(*device, one), ReduceOp::kSum).ok());
  }
  ASSERT_TRUE(Scale(s, On(*device, acc), 0.25f).ok());
  ASSERT_TRUE(Synchronize(s, std::chrono::seconds(10)).ok());
  EXPECT_EQ(acc, std::vector<float>(1000, 1.0f));
}

}  // namespace
}  // namespace kc::hal
