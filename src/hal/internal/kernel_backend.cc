#include "hal/internal/kernel_backend.h"

namespace kc::hal::internal {

Status KernelBackend::Gemm(Stream& stream, const GemmOptions& o) {
  if (o.ab_type != DataType::kF32 || o.c_type != DataType::kF32) {
    return UnimplementedError(
        "gemm: bf16 operands need a device with bf16 matrix units (CUDA); "
        "this backend runs f32 products only");
  }
  auto as_float = [](auto span) {
    using B = typename decltype(span)::element_type;
    using F = std::conditional_t<std::is_const_v<B>, const float, float>;
    return DeviceSpan<F>(reinterpret_cast<F*>(span.data()), span.size() / sizeof(float),
                         span.device());
  };
  return SgemmStridedBatched(stream, {.gemm = {.trans_a = o.trans_a,
                                               .trans_b = o.trans_b,
                                               .m = o.m,
                                               .n = o.n,
                                               .k = o.k,
                                               .alpha = o.alpha,
                                               .a = as_float(o.a),
                                               .lda = o.lda,
                                               .b = as_float(o.b),
                                               .ldb = o.ldb,
                                               .beta = o.beta,
                                               .c = as_float(o.c),
                                               .ldc = o.ldc},
                                      .batch_count = o.batch_count,
                                      .stride_a = o.stride_a,
                                      .stride_b = o.stride_b,
                                      .stride_c = o.stride_c});
}

Result<std::unique_ptr<KernelModule>> KernelBackend::Compile(const KernelSource& source) {
  return UnimplementedError("compile " + source.name +
                            ": this device runs no run-time compiled kernels (CUDA does)");
}

Status KernelBackend::Launch(Stream&, const KernelFunction& function, const LaunchShape&,
                             std::span<void* const>) {
  return UnimplementedError("launch " + function.name +
                            ": this device runs no run-time compiled kernels (CUDA does)");
}

}  // namespace kc::hal::internal
