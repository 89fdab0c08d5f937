// The sgemm rate behind a CPU slice's peak_flops_fp32.
#include <chrono>
#include <limits>

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

}  // namespace kc::hal
