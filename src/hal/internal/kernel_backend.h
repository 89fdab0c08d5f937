// The seam between the checked front ends (hal/compute.cc, hal/kernels.cc) and a backend
// (hal/cpu/, later hal/cuda/). Type-erased so it stays one small virtual interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/clock.h"
#include "base/status.h"
#include "hal/compute.h"
#include "hal/kernels.h"
#include "hal/runtime_kernels.h"

namespace kc::hal::internal {

enum class CopyKind : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// What a backend implements. Every call comes from a front end that has checked its
// arguments (sizes, devices, alignment, overlap, enum ranges) and resolved defaults
// (leading dimensions are explicit, counts > 0 unless stated), so a backend only enqueues
// the work on `stream`, which belongs to the backend's device. Returns errors of enqueuing
// only; execution errors are reported by Synchronize. Thread safety as the device's.
class KernelBackend {
 public:
  virtual ~KernelBackend() = default;

  virtual Status Copy(Stream& stream, CopyKind kind, void* dst, const void* src,
                      size_t size_bytes) = 0;
  virtual Status Synchronize(Stream& stream, Duration timeout) = 0;

  // options.gemm: m, n, k >= 0, ld* resolved and valid; batch_count >= 0.
  virtual Status SgemmStridedBatched(Stream& stream, const SgemmStridedBatchedOptions& options) = 0;
  // options: checked, leading dimensions resolved, types a valid combination. The default runs
  // f32 products through SgemmStridedBatched and returns kUnimplemented for bf16.
  virtual Status Gemm(Stream& stream, const GemmOptions& options);

  virtual Status ReduceInto(Stream& stream, DataType type, ReduceOp op, void* dst, const void* src,
                            size_t count) = 0;
  // type: kF32, kF64 or kBf16; alpha is converted to the compute type (fp32 for bf16).
  virtual Status Scale(Stream& stream, DataType type, void* x, size_t count, double alpha) = 0;
  virtual Status Axpy(Stream& stream, DataType type, void* y, double alpha, const void* x,
                      size_t count) = 0;
  // value: one element of `type`.
  virtual Status Fill(Stream& stream, DataType type, void* x, size_t count, const void* value) = 0;
  // (dst_type, src_type): (kBf16, kF32) or (kF32, kBf16).
  virtual Status Convert(Stream& stream, DataType dst_type, void* dst, DataType src_type,
                         const void* src, size_t count) = 0;

  // Run-time compiled kernels (hal/runtime_kernels.h). The defaults, for a backend that
  // compiles nothing, return kUnimplemented. Launch gets a function of this backend's device
  // and a checked shape.
  virtual Result<std::unique_ptr<KernelModule>> Compile(const KernelSource& source);
  virtual Status Launch(Stream& stream, const KernelFunction& function, const LaunchShape& shape,
                        std::span<void* const> args);
};

}  // namespace kc::hal::internal
