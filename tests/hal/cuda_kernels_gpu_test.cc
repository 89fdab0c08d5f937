// The CUDA backend on a real GPU: every kernel of hal/kernels.h against its reference loop
// (hal/reference_kernels.h) with the tolerance stated beside each comparison, copies,
// run-time compiled kernels, and Synchronize's deadline. Skipped where no CUDA device is
// found (label gpu; the CPU suite never needs one).
#include <gtest/gtest.h>

#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "hal/compute.h"
#include "hal/cuda/cuda_device.h"
#include "hal/kernels.h"
#include "hal/measure.h"
#include "hal/reference_kernels.h"
#include "hal/runtime_kernels.h"

namespace kc::hal {
namespace {

constexpr uint32_t kSeed = 20261204;  // fixed: every run draws the same data
constexpr auto kTimeout = std::chrono::seconds(60);

// One GPU for the whole suite: opening it compiles the element-wise kernels.
class CudaKernelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<int> count = cuda::CudaDeviceCount();
    if (!count.ok()) {
      skip_reason_ = new std::string(count.status().ToString());
      return;
    }
    Result<std::unique_ptr<ComputeDevice>> d = OpenComputeDevice(
        {.id = "test/gpu0", .kind = DeviceKind::kCuda, .host = "local", .index_on_host = 0});
    KC_CHECK(d.ok()) << d.status();
    device_ = std::move(d).value().release();
  }
  static void TearDownTestSuite() {
    delete device_;
    device_ = nullptr;
  }
  void SetUp() override {
    if (device_ == nullptr) GTEST_SKIP() << "no CUDA device: " << *skip_reason_;
  }

  static Stream& stream() { return device_->default_stream(); }

  template <typename T>
  static DeviceBuffer Upload(const std::vector<T>& v) {
    Result<DeviceBuffer> b = device_->Allocate(std::max<size_t>(1, v.size()) * sizeof(T));
    KC_CHECK(b.ok()) << b.status();
    if (!v.empty()) {
      KC_CHECK(CopyHostToDevice<T>(stream(), b->As<T>().first(v.size()), v).ok());
      KC_CHECK(Synchronize(stream(), kTimeout).ok());
    }
    return std::move(b).value();
  }
  template <typename T>
  static std::vector<T> Download(const DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    Status s = CopyDeviceToHost<T>(stream(), v, b.As<T>().first(n));
    KC_CHECK(s.ok()) << s;
    s = Synchronize(stream(), kTimeout);
    KC_CHECK(s.ok()) << s;
    return v;
  }

  static inline ComputeDevice* device_ = nullptr;
  static inline std::string* skip_reason_ = nullptr;
};

std::vector<float> RandomFloats(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST_F(CudaKernelsTest, CopiesRoundTripThroughTheDevice) {
  std::mt19937 rng(kSeed);
  const std::vector<float> host = RandomFloats(rng, 100003);
  DeviceBuffer a = Upload(host);
  Result<DeviceBuffer> b = device_->Allocate(host.size() * sizeof(float));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(CopyDeviceToDevice<float>(stream(), b->As<float>().first(host.size()),
                                        a.As<float>().first(host.size()))
                  .ok());
  EXPECT_EQ(Download<float>(*b, host.size()), host);
  EXPECT_EQ(device_->id().kind, DeviceKind::kCuda);
  EXPECT_FALSE(device_->id().host_accessible());
}

// Sgemm on the GPU against the double-accumulating reference, within the forward error bound
// of an fp32 dot product of length K, (K + 2) * FLT_EPSILON * sum |A| |B|, on shapes with odd
// sizes, transposes, padding (NaN-filled: never read) and batches.
struct GemmCase {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
  int64_t batch;
  float alpha, beta;
};

class CudaSgemmTest : public CudaKernelsTest, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(CudaSgemmTest, MatchesTheReference) {
  const GemmCase g = GetParam();
  std::mt19937 rng(kSeed);
  const int64_t a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
  const int64_t b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = g.n + 2;
  const int64_t sa = a_rows * lda, sb = b_rows * ldb, sc = g.m * ldc;
  std::vector<float> a = RandomFloats(rng, static_cast<size_t>(g.batch * sa));
  std::vector<float> b = RandomFloats(rng, static_cast<size_t>(g.batch * sb));
  std::vector<float> c = RandomFloats(rng, static_cast<size_t>(g.batch * sc));
  for (int64_t i = 0; i < g.batch * g.m; ++i) {  // C's padding must stay as it is
    for (int64_t j = g.n; j < ldc; ++j) c[static_cast<size_t>(i * ldc + j)] = -7.0f;
  }
  DeviceBuffer da = Upload(a), db = Upload(b), dc = Upload(c);
  ASSERT_TRUE(
      SgemmStridedBatched(stream(), {.gemm = {.trans_a = g.ta ? Transpose::kYes : Transpose::kNo,
                                              .trans_b = g.tb ? Transpose::kYes : Transpose::kNo,
                                              .m = g.m,
                                              .n = g.n,
                                              .k = g.k,
                                              .alpha = g.alpha,
                                              .a = da.As<float>().first(a.size()),
                                              .lda = lda,
                                              .b = db.As<float>().first(b.size()),
                                              .ldb = ldb,
                                              .beta = g.beta,
                                              .c = dc.As<float>().first(c.size()),
                                              .ldc = ldc},
                                     .batch_count = g.batch,
                                     .stride_a = sa,
                                     .stride_b = sb,
                                     .stride_c = sc})
          .ok());
  const std::vector<float> got = Download<float>(dc, c.size());
  std::vector<float> want = c;
  reference::SgemmArgs args{.trans_a = g.ta ? Transpose::kYes : Transpose::kNo,
                            .trans_b = g.tb ? Transpose::kYes : Transpose::kNo,
                            .m = g.m,
                            .n = g.n,
                            .k = g.k,
                            .alpha = g.alpha,
                            .a = a,
                            .lda = lda,
                            .b = b,
                            .ldb = ldb,
                            .beta = g.beta,
                            .c = want,
                            .ldc = ldc};
  reference::SgemmStridedBatched(args, g.batch, sa, sb, sc);
  for (size_t i = 0; i < got.size(); ++i) {
    const bool padding = static_cast<int64_t>(i) % ldc >= g.n;
    if (padding) {
      ASSERT_EQ(got[i], -7.0f) << "padding written at " << i;
      continue;
    }
    const double tol =
        (g.k + 2) * double{FLT_EPSILON} * (std::fabs(g.alpha) * g.k + std::fabs(g.beta));
    ASSERT_NEAR(got[i], want[i], tol) << g.name << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaSgemmTest,
    ::testing::Values(GemmCase{"square", 64, 64, 64, false, false, 1, 1.0f, 0.0f},
                      GemmCase{"odd", 37, 53, 29, false, false, 1, 0.5f, 0.25f},
                      GemmCase{"ta", 33, 17, 65, true, false, 1, 1.0f, 0.0f},
                      GemmCase{"tb", 31, 47, 19, false, true, 1, 1.0f, 1.0f},
                      GemmCase{"both", 16, 9, 130, true, true, 1, -1.0f, 0.5f},
                      GemmCase{"batched", 13, 21, 8, false, true, 5, 1.0f, 0.0f}),
    [](const ::testing::TestParamInfo<GemmCase>& info) { return std::string(info.param.name); });

// Gemm with bf16 operands: the reference multiplies the same bf16 values in double. fp32
// accumulation gives the Sgemm bound; a bf16 C adds one rounding, 2^-8 relative.
TEST_F(CudaKernelsTest, Bf16GemmMatchesTheReferenceOnTheSameBf16Values) {
  std::mt19937 rng(kSeed);
  const int64_t m = 70, n = 45, k = 96, batch = 3;
  std::vector<Bf16> a(static_cast<size_t>(batch * m * k)), b(static_cast<size_t>(batch * n * k));
  std::vector<float> a32(a.size()), b32(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    a32[i] = Bf16ToFloat(a[i] = FloatToBf16(RandomFloats(rng, 1)[0]));
  for (size_t i = 0; i < b.size(); ++i)
    b32[i] = Bf16ToFloat(b[i] = FloatToBf16(RandomFloats(rng, 1)[0]));
  // C (m, n) = A (m, k) B^T, B stored (n, k).
  std::vector<float> want(static_cast<size_t>(batch * m * n), 0.0f);
  reference::SgemmArgs args{.trans_b = Transpose::kYes,
                            .m = m,
                            .n = n,
                            .k = k,
                            .a = a32,
                            .lda = k,
                            .b = b32,
                            .ldb = k,
                            .c = want,
                            .ldc = n};
  reference::SgemmStridedBatched(args, batch, m * k, n * k, m * n);
  DeviceBuffer da = Upload(a), db = Upload(b);
  for (DataType c_type : {DataType::kF32, DataType::kBf16}) {
    SCOPED_TRACE(std::string(DataTypeName(c_type)));
    Result<DeviceBuffer> dc = device_->Allocate(want.size() * DataTypeSize(c_type));
    ASSERT_TRUE(dc.ok());
    ASSERT_TRUE(Gemm(stream(), {.trans_b = Transpose::kYes,
                                .m = m,
                                .n = n,
                                .k = k,
                                .ab_type = DataType::kBf16,
                                .a = AsBytes(da.As<Bf16>()),
                                .lda = k,
                                .b = AsBytes(db.As<Bf16>()),
                                .ldb = k,
                                .c_type = c_type,
                                .c = dc->bytes(),
                                .ldc = n,
                                .batch_count = batch,
                                .stride_a = m * k,
                                .stride_b = n * k,
                                .stride_c = m * n})
                    .ok());
    std::vector<float> got(want.size());
    if (c_type == DataType::kF32) {
      got = Download<float>(*dc, want.size());
    } else {
      const std::vector<Bf16> narrow = Download<Bf16>(*dc, want.size());
      for (size_t i = 0; i < got.size(); ++i) got[i] = Bf16ToFloat(narrow[i]);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      double tol = (k + 2) * double{FLT_EPSILON} * k;
      if (c_type == DataType::kBf16) tol += std::fabs(want[i]) * 0x1.0p-8;
      ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
    }
  }
}

// The element-wise kernels compute each element with the same rounded IEEE operations as
// the reference (no fused multiply-add), so they must match it bit for bit.
template <typename T>
std::vector<T> Values(std::mt19937& rng, size_t n) {
  std::vector<T> v(n);
  std::uniform_int_distribution<int> small(-1000, 1000);
  for (T& x : v) {
    if constexpr (std::is_same_v<T, Bf16>) {
      x = FloatToBf16(static_cast<float>(small(rng)) / 37.0f);
    } else if constexpr (std::is_floating_point_v<T>) {
      x = static_cast<T>(small(rng)) / static_cast<T>(37);
    } else {
      x = static_cast<T>(small(rng)) * static_cast<T>(1 << 20);  // products wrap
    }
  }
  return v;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
void CheckReduce(std::mt19937& rng, ReduceOp op, DeviceBuffer (*upload)(const std::vector<T>&),
                 std::vector<T> (*download)(const DeviceBuffer&, size_t), Stream& stream) {
  const size_t n = 70001;
  std::vector<T> dst = Values<T>(rng, n), src = Values<T>(rng, n);
  if constexpr (std::is_same_v<T, float>) dst[5] = std::nanf("");  // min/max propagate NaN
  DeviceBuffer d = upload(dst), s = upload(src);
  ASSERT_TRUE(ReduceInto(stream, {.type = DataTypeOf<T>::value,
                                  .op = op,
                                  .dst = d.bytes().first(n * sizeof(T)),
                                  .src = s.bytes().first(n * sizeof(T))})
                  .ok());
  reference::ReduceInto(std::span<T>(dst), std::span<const T>(src), op);
  const std::vector<T> got = download(d, n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(dst[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << i;
        continue;
      }
    }
    ASSERT_EQ(std::memcmp(&got[i], &dst[i], sizeof(T)), 0)
        << DataTypeName(DataTypeOf<T>::value) << " " << ReduceOpName(op) << " element " << i;
  }
}

TEST_F(CudaKernelsTest, ReduceIntoMatchesTheReferenceBitForBitForEveryTypeAndOp) {
  std::mt19937 rng(kSeed);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
    CheckReduce<float>(rng, op, &Upload<float>, &Download<float>, stream());
    CheckReduce<double>(rng, op, &Upload<double>, &Download<double>, stream());
    CheckReduce<int32_t>(rng, op, &Upload<int32_t>, &Download<int32_t>, stream());
    CheckReduce<int64_t>(rng, op, &Upload<int64_t>, &Download<int64_t>, stream());
    CheckReduce<Bf16>(rng, op, &Upload<Bf16>, &Download<Bf16>, stream());
  }
}

TEST_F(CudaKernelsTest, ScaleAxpyFillAndConvertMatchTheReferenceBitForBit) {
  std::mt19937 rng(kSeed);
  const size_t n = 50021;
  {
    std::vector<float> x = Values<float>(rng, n), y = Values<float>(rng, n);
    DeviceBuffer dx = Upload(x), dy = Upload(y);
    ASSERT_TRUE(Scale(stream(), dx.As<float>().first(n), 0.3f).ok());
    ASSERT_TRUE(Axpy(stream(), dy.As<float>().first(n), -1.7f,
                     DeviceSpan<const float>(dx.As<float>().first(n)))
                    .ok());
    reference::Scale(std::span<float>(x), 0.3f);
    reference::Axpy(std::span<float>(y), -1.7f, std::span<const float>(x));
    EXPECT_TRUE(SameBits(Download<float>(dx, n), x));
    EXPECT_TRUE(SameBits(Download<float>(dy, n), y));
  }
  {
    std::vector<Bf16> x = Values<Bf16>(rng, n), y = Values<Bf16>(rng, n);
    DeviceBuffer dx = Upload(x), dy = Upload(y);
    ASSERT_TRUE(Scale(stream(), dx.As<Bf16>().first(n), 0.3f).ok());
    ASSERT_TRUE(Axpy(stream(), dy.As<Bf16>().first(n), -1.7f,
                     DeviceSpan<const Bf16>(dx.As<Bf16>().first(n)))
                    .ok());
    reference::Scale(std::span<Bf16>(x), 0.3f);
    reference::Axpy(std::span<Bf16>(y), -1.7f, std::span<const Bf16>(x));
    EXPECT_TRUE(SameBits(Download<Bf16>(dx, n), x));
    EXPECT_TRUE(SameBits(Download<Bf16>(dy, n), y));
  }
  {
    std::vector<double> x = Values<double>(rng, n);
    DeviceBuffer dx = Upload(x);
    ASSERT_TRUE(Scale(stream(), dx.As<double>().first(n), 0.3).ok());
    reference::Scale(std::span<double>(x), 0.3);
    EXPECT_TRUE(SameBits(Download<double>(dx, n), x));
  }
  {
    std::vector<float> f = RandomFloats(rng, n);
    f[3] = std::nanf("");
    f[4] = 3.4e38f;  // rounds to inf
    DeviceBuffer df = Upload(f);
    Result<DeviceBuffer> db = device_->Allocate(n * sizeof(Bf16));
    Result<DeviceBuffer> dback = device_->Allocate(n * sizeof(float));
    ASSERT_TRUE(db.ok() && dback.ok());
    ASSERT_TRUE(ConvertF32ToBf16(stream(), db->As<Bf16>().first(n),
                                 DeviceSpan<const float>(df.As<float>().first(n)))
                    .ok());
    ASSERT_TRUE(ConvertBf16ToF32(stream(), dback->As<float>().first(n),
                                 DeviceSpan<const Bf16>(db->As<Bf16>().first(n)))
                    .ok());
    std::vector<Bf16> want(n);
    reference::ConvertF32ToBf16(want, f);
    std::vector<float> back(n);
    reference::ConvertBf16ToF32(back, want);
    EXPECT_TRUE(SameBits(Download<Bf16>(*db, n), want));
    EXPECT_TRUE(SameBits(Download<float>(*dback, n), back));
  }
  {
    Result<DeviceBuffer> b = device_->Allocate(n * 8);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(Fill(stream(), b->As<int64_t>().first(n), int64_t{-5}).ok());
    EXPECT_EQ(Download<int64_t>(*b, n), std::vector<int64_t>(n, -5));
    ASSERT_TRUE(Fill(stream(), b->As<Bf16>().first(n), Bf16{0x3f80}).ok());
    EXPECT_EQ(Download<Bf16>(*b, n), std::vector<Bf16>(n, Bf16{0x3f80}));
    ASSERT_TRUE(Fill(stream(), b->As<float>().first(n), 2.5f).ok());
    EXPECT_EQ(Download<float>(*b, n), std::vector<float>(n, 2.5f));
  }
}

TEST_F(CudaKernelsTest, ACompiledKernelRunsWithItsArguments) {
  Result<std::unique_ptr<KernelModule>> module = CompileKernels(
      *device_, {.name = "test_axpb",
                 .code = R"(extern "C" __global__ void axpb(float* y, const float* x, float a,
                                                              float b, int n) {
                              int i = blockIdx.x * blockDim.x + threadIdx.x;
                              if (i < n) y[i] = a * x[i] + b;
                            })"});
  ASSERT_TRUE(module.ok()) << module.status();
  Result<KernelFunction> fn = (*module)->Function("axpb");
  ASSERT_TRUE(fn.ok()) << fn.status();
  EXPECT_EQ((*module)->Function("missing").status().code(), ErrorCode::kNotFound);
  const int n = 1000;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i);
  DeviceBuffer dx = Upload(x), dy = Upload(std::vector<float>(n, 0.0f));
  float* y = dy.As<float>().data();
  const float* xs = dx.As<float>().data();
  const float a = 2.0f, b = 1.0f;
  ASSERT_TRUE(
      Launch(stream(), *fn, {.grid_x = (n + 127) / 128, .block_x = 128}, y, xs, a, b, n).ok());
  const std::vector<float> got = Download<float>(dy, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], 2.0f * i + 1.0f) << i;
  EXPECT_EQ(Launch(stream(), *fn, {.grid_x = 1, .block_x = 2048}, y, xs, a, b, n).code(),
            ErrorCode::kInvalidArgument);
}

TEST_F(CudaKernelsTest, SynchronizeReturnsDeadlineExceededWhileWorkRunsThenSucceeds) {
  Result<std::unique_ptr<KernelModule>> module = CompileKernels(
      *device_, {.name = "test_spin", .code = R"(extern "C" __global__ void spin(long long cycles) {
                              long long start = clock64();
                              while (clock64() - start < cycles) {}
                            })"});
  ASSERT_TRUE(module.ok()) << module.status();
  Result<KernelFunction> fn = (*module)->Function("spin");
  ASSERT_TRUE(fn.ok());
  const long long cycles = 400'000'000;  // about 0.2 s at 2 GHz
  ASSERT_TRUE(Launch(stream(), *fn, {}, cycles).ok());
  EXPECT_EQ(Synchronize(stream(), std::chrono::milliseconds(1)).code(),
            ErrorCode::kDeadlineExceeded);
  EXPECT_TRUE(Synchronize(stream(), kTimeout).ok());
}

TEST_F(CudaKernelsTest, TheMatrixRateIsMeasuredInBothPrecisions) {
  for (DataType t : {DataType::kF32, DataType::kBf16}) {
    Result<double> flops = MeasureGemmFlops(*device_, {.type = t, .n = 2048, .repetitions = 5});
    ASSERT_TRUE(flops.ok()) << flops.status();
    EXPECT_GT(*flops, 1e12) << DataTypeName(t);  // any GPU of this decade does a TFLOP/s
    std::cout << DataTypeName(t) << " gemm 2048^3: " << *flops / 1e12 << " TFLOP/s\n";
  }
}

}  // namespace
}  // namespace kc::hal
