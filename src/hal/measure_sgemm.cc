// The matrix-multiply rates behind a CPU slice's peak_flops_fp32 and a GPU's MFU.
#include <chrono>
#include <limits>
#include <vector>

#include "base/layer_guard.h"
#include "hal/compute.h"
#include "hal/kernels.h"
#include "hal/measure.h"

namespace kc::hal {

Result<double> MeasureSgemmFlops(const SgemmRateOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "measure");
  if (options.n <= 0 || options.threads <= 0 || options.repetitions <= 0) {
    return InvalidArgumentError("sgemm rate: n, threads and repetitions must be positive");
  }
  DeviceDescriptor d{.id = "measure/cpu", .kind = DeviceKind::kCpu};
  KC_ASSIGN_OR_RETURN(std::unique_ptr<ComputeDevice> device,
                      OpenComputeDevice(d, {.threads = options.threads}));
  const int64_t n = options.n;
  const size_t bytes = static_cast<size_t>(n * n) * sizeof(float);
  KC_ASSIGN_OR_RETURN(DeviceBuffer a, device->Allocate(bytes));
  KC_ASSIGN_OR_RETURN(DeviceBuffer b, device->Allocate(bytes));
  KC_ASSIGN_OR_RETURN(DeviceBuffer c, device->Allocate(bytes));
  Stream& stream = device->default_stream();
  KC_RETURN_IF_ERROR(Fill(stream, a.As<float>(), 0.5f));
  KC_RETURN_IF_ERROR(Fill(stream, b.As<float>(), 0.25f));
  const SgemmOptions gemm{.m = n,
                          .n = n,
                          .k = n,
                          .a = a.As<float>(),
                          .lda = n,
                          .b = b.As<float>(),
                          .ldb = n,
                          .c = c.As<float>(),
                          .ldc = n};
  KC_RETURN_IF_ERROR(Sgemm(stream, gemm));  // warm-up: threads started, pages touched
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < options.repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    KC_RETURN_IF_ERROR(Sgemm(stream, gemm));
    KC_RETURN_IF_ERROR(Synchronize(stream, std::chrono::seconds(60)));
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

Result<double> MeasureGemmFlops(ComputeDevice& device, const GemmRateOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "measure");
  if (options.n <= 0 || options.repetitions <= 0 ||
      (options.type != DataType::kF32 && options.type != DataType::kBf16)) {
    return InvalidArgumentError(
        "gemm rate: n and repetitions must be positive, the type f32 or "
        "bf16");
  }
  const int64_t n = options.n;
  const size_t count = static_cast<size_t>(n * n);
  const size_t bytes = count * DataTypeSize(options.type);
  KC_ASSIGN_OR_RETURN(DeviceBuffer a, device.Allocate(bytes));
  KC_ASSIGN_OR_RETURN(DeviceBuffer b, device.Allocate(bytes));
  KC_ASSIGN_OR_RETURN(DeviceBuffer c, device.Allocate(bytes));
  Stream& stream = device.default_stream();
  // Values in [-1, 1) from a fixed LCG: the same operands on every run.
  std::vector<float> values(count);
  uint64_t state = 0x2545f4914f6cdd1dull;
  for (float& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-52 - 1.0);
  }
  if (options.type == DataType::kF32) {
    KC_RETURN_IF_ERROR(CopyHostToDevice<float>(stream, a.As<float>(), values));
    KC_RETURN_IF_ERROR(CopyHostToDevice<float>(stream, b.As<float>(), values));
  } else {
    std::vector<Bf16> narrow(count);
    for (size_t i = 0; i < count; ++i) narrow[i] = FloatToBf16(values[i]);
    KC_RETURN_IF_ERROR(CopyHostToDevice<Bf16>(stream, a.As<Bf16>(), narrow));
    KC_RETURN_IF_ERROR(CopyHostToDevice<Bf16>(stream, b.As<Bf16>(), narrow));
    KC_RETURN_IF_ERROR(Synchronize(stream, std::chrono::seconds(60)));  // `narrow` is read
  }
  const GemmOptions gemm{.m = n,
                         .n = n,
                         .k = n,
                         .ab_type = options.type,
                         .a = a.bytes(),
                         .lda = n,
                         .b = b.bytes(),
                         .ldb = n,
                         .c_type = options.type,
                         .c = c.bytes(),
                         .ldc = n};
  KC_RETURN_IF_ERROR(Gemm(stream, gemm));  // warm-up: the library's choice made, clocks up
  KC_RETURN_IF_ERROR(Synchronize(stream, std::chrono::seconds(60)));
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < options.repetitions; ++r) KC_RETURN_IF_ERROR(Gemm(stream, gemm));
  KC_RETURN_IF_ERROR(Synchronize(stream, std::chrono::seconds(600)));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) *
         options.repetitions / seconds;
}

}  // namespace kc::hal
