#include "hal/cuda/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

#include "base/log.h"
#include "base/mutex.h"
#include "base/notification.h"
#include "hal/cuda/cuda_api.h"
#include "hal/cuda/nvrtc.h"
#include "hal/internal/kernel_backend.h"

namespace kc::hal::cuda {
namespace {

// The element-wise kernels of hal/kernels.h (after KernelPrelude()). Grid-stride loops over n
// elements; bf16 widens to fp32 and rounds to nearest even once, as FloatToBf16 does; the scale and
// axpy products are rounded operations (__fmul_rn, __fadd_rn), never fused, so the results equal
// the CPU's bit for bit.
constexpr const char* kElementwiseSource = R"CUDA(

template <typename T> __device__ __forceinline__ T op_min(T a, T b) { return b < a ? b : a; }
template <typename T> __device__ __forceinline__ T op_max(T a, T b) { return b > a ? b : a; }
// Floating point: either operand NaN gives NaN.
template <typename T> __device__ __forceinline__ T fmin_nan(T a, T b) {
  return a != a ? a : (b != b ? b : op_min(a, b));
}
template <typename T> __device__ __forceinline__ T fmax_nan(T a, T b) {
  return a != a ? a : (b != b ? b : op_max(a, b));
}

#define REDUCE_FLOAT(NAME, T, ADD, MUL)                                                        \
  extern "C" __global__ void kc_reduce_##NAME##_sum(T* d, const T* s, u64 n) {                 \
    GRID_STRIDE(i, n) d[i] = ADD(d[i], s[i]);                                                  \
  }                                                                                            \
  extern "C" __global__ void kc_reduce_##NAME##_prod(T* d, const T* s, u64 n) {                \
    GRID_STRIDE(i, n) d[i] = MUL(d[i], s[i]);                                                  \
  }                                                                                            \
  extern "C" __global__ void kc_reduce_##NAME##_min(T* d, const T* s, u64 n) {                 \
    GRID_STRIDE(i, n) d[i] = fmin_nan(d[i], s[i]);                                             \
  }                                                                                            \
  extern "C" __global__ void kc_reduce_##NAME##_max(T* d, const T* s, u64 n) {                 \
    GRID_STRIDE(i, n) d[i] = fmax_nan(d[i], s[i]);                                             \
  }
REDUCE_FLOAT(f32, float, __fadd_rn, __fmul_rn)
REDUCE_FLOAT(f64, double, __dadd_rn, __dmul_rn)

// Integers wrap: computed in the unsigned type of the same width.
#define REDUCE_INT(NAME, T, U)                                                                 \
  extern "C" __global__ void kc_reduce_##NAME##_sum(T* d, const T* s, u64 n) {                 \
    GRID_STRIDE(i, n) d[i] = (T)((U)d[i] + (U)s[i]);                                           \
  }                                                                                            \
  extern "C" __global__ void kc_reduce_##NAME##_prod(T* d, const T* s, u64 n) {                \
    GRID_STRIDE(i, n) d[i] = (T)((U)d[i] * (U)s[i]);                                           \
  }                                                                                            \
  extern "C" __global__ void kc_reduce_##NAME##_min(T* d, const T* s, u64 n) {                 \
    GRID_STRIDE(i, n) d[i] = op_min(d[i], s[i]);                                               \
  }                                                                                            \
  extern "C" __global__ void kc_reduce_##NAME##_max(T* d, const T* s, u64 n) {                 \
    GRID_STRIDE(i, n) d[i] = op_max(d[i], s[i]);                                               \
  }
REDUCE_INT(i32, int, unsigned int)
REDUCE_INT(i64, long long, unsigned long long)

extern "C" __global__ void kc_reduce_bf16_sum(bf16_t* d, const bf16_t* s, u64 n) {
  GRID_STRIDE(i, n) d[i] = f2bf(__fadd_rn(bf2f(d[i]), bf2f(s[i])));
}
extern "C" __global__ void kc_reduce_bf16_prod(bf16_t* d, const bf16_t* s, u64 n) {
  GRID_STRIDE(i, n) d[i] = f2bf(__fmul_rn(bf2f(d[i]), bf2f(s[i])));
}
extern "C" __global__ void kc_reduce_bf16_min(bf16_t* d, const bf16_t* s, u64 n) {
  GRID_STRIDE(i, n) d[i] = f2bf(fmin_nan(bf2f(d[i]), bf2f(s[i])));
}
extern "C" __global__ void kc_reduce_bf16_max(bf16_t* d, const bf16_t* s, u64 n) {
  GRID_STRIDE(i, n) d[i] = f2bf(fmax_nan(bf2f(d[i]), bf2f(s[i])));
}

extern "C" __global__ void kc_scale_f32(float* x, u64 n, float a) {
  GRID_STRIDE(i, n) x[i] = __fmul_rn(a, x[i]);
}
extern "C" __global__ void kc_scale_f64(double* x, u64 n, double a) {
  GRID_STRIDE(i, n) x[i] = __dmul_rn(a, x[i]);
}
extern "C" __global__ void kc_scale_bf16(bf16_t* x, u64 n, float a) {
  GRID_STRIDE(i, n) x[i] = f2bf(__fmul_rn(a, bf2f(x[i])));
}
extern "C" __global__ void kc_axpy_f32(float* y, float a, const float* x, u64 n) {
  GRID_STRIDE(i, n) y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}
extern "C" __global__ void kc_axpy_f64(double* y, double a, const double* x, u64 n) {
  GRID_STRIDE(i, n) y[i] = __dadd_rn(y[i], __dmul_rn(a, x[i]));
}
extern "C" __global__ void kc_axpy_bf16(bf16_t* y, float a, const bf16_t* x, u64 n) {
  GRID_STRIDE(i, n) y[i] = f2bf(__fadd_rn(bf2f(y[i]), __fmul_rn(a, bf2f(x[i]))));
}
extern "C" __global__ void kc_fill_u16(unsigned short* x, u64 n, unsigned short v) {
  GRID_STRIDE(i, n) x[i] = v;
}
extern "C" __global__ void kc_fill_u32(unsigned int* x, u64 n, unsigned int v) {
  GRID_STRIDE(i, n) x[i] = v;
}
extern "C" __global__ void kc_fill_u64(unsigned long long* x, u64 n, unsigned long long v) {
  GRID_STRIDE(i, n) x[i] = v;
}
extern "C" __global__ void kc_convert_f32_bf16(bf16_t* d, const float* s, u64 n) {
  GRID_STRIDE(i, n) d[i] = f2bf(s[i]);
}
extern "C" __global__ void kc_convert_bf16_f32(float* d, const bf16_t* s, u64 n) {
  GRID_STRIDE(i, n) d[i] = bf2f(s[i]);
}
)CUDA";

constexpr uint32_t kBlock = 256;

CUdeviceptr Ptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

class CudaDevice;

// A CUDA stream (non-blocking: it does not wait for the legacy default stream) and the cuBLAS
// handle bound to it, made on first use.
class CudaStream final : public Stream {
 public:
  CudaStream(ComputeDevice* device, const DriverApi* api, CUcontext context, CUstream stream)
      : Stream(device), api_(api), context_(context), stream_(stream) {}
  ~CudaStream() override {
    api_->cuCtxSetCurrent(context_);
    if (blas_ != nullptr) {
      if (Result<const CublasApi*> blas = Cublas(); blas.ok()) (*blas)->cublasDestroy(blas_);
    }
    api_->cuStreamDestroy(stream_);
  }

  CUstream handle() const { return stream_; }

  Result<cublasHandle_t> Blas() {
    if (blas_ != nullptr) return blas_;
    KC_ASSIGN_OR_RETURN(const CublasApi* blas, Cublas());
    cublasHandle_t h = nullptr;
    if (cublasStatus_t s = blas->cublasCreate(&h); s != kCublasSuccess) {
      return CublasError(s, "cublasCreate");
    }
    if (cublasStatus_t s = blas->cublasSetStream(h, stream_); s != kCublasSuccess) {
      blas->cublasDestroy(h);
      return CublasError(s, "cublasSetStream");
    }
    // fp32 products stay fp32 (no TF32), so that they match the CPU's within fp32 rounding.
    blas->cublasSetMathMode(h, kCublasDefaultMath);
    blas_ = h;
    return blas_;
  }

 private:
  const DriverApi* const api_;  // process lifetime
  const CUcontext context_;     // the device's primary context, retained while the device lives
  const CUstream stream_;
  cublasHandle_t blas_ = nullptr;
};

class CudaModule final : public KernelModule {
 public:
  CudaModule(ComputeDevice* device, const DriverApi* api, CUcontext context, CUmodule module,
             std::string name)
      : KernelModule(device),
        api_(api),
        context_(context),
        module_(module),
        name_(std::move(name)) {}
  ~CudaModule() override {
    api_->cuCtxSetCurrent(context_);
    api_->cuModuleUnload(module_);
  }

  Result<KernelFunction> Function(std::string_view name) const override {
    api_->cuCtxSetCurrent(context_);
    CUfunction f = nullptr;
    const std::string n(name);
    if (CUresult r = api_->cuModuleGetFunction(&f, module_, n.c_str()); r != kCudaSuccess) {
      return NotFoundError("module " + name_ + " has no kernel " + n + ": " + DriverErrorText(r));
    }
    return KernelFunction{.handle = f, .module = this, .name = n};
  }

 private:
  const DriverApi* const api_;
  const CUcontext context_;
  const CUmodule module_;
  const std::string name_;
};

// One GPU. Safe for concurrent use across streams; each stream by one thread at a time.
class CudaDevice final : public ComputeDevice, public internal::KernelBackend {
 public:
  CudaDevice(const DeviceDescriptor& descriptor, const DriverApi* api, CUdevice device,
             CUcontext context, int multiprocessors, CompileTarget target)
      : ComputeDevice(descriptor, DeviceId{DeviceKind::kCuda, descriptor.index_on_host}),
        api_(api),
        device_(device),
        context_(context),
        multiprocessors_(multiprocessors),
        target_(std::move(target)) {}

  ~CudaDevice() override {
    api_->cuCtxSetCurrent(context_);
    default_stream_.reset();
    elementwise_.reset();
    CheckNothingLive();
    api_->cuDevicePrimaryCtxRelease(device_);
  }

  // Second-phase construction: what can fail.
  Status Init() {
    KC_RETURN_IF_ERROR(MakeCurrent());
    KC_ASSIGN_OR_RETURN(std::unique_ptr<Stream> s, CreateStream());
    default_stream_ = std::move(s);
    KC_ASSIGN_OR_RETURN(elementwise_, Compile(ElementwiseKernelSource()));
    return OkStatus();
  }

  Result<std::unique_ptr<Stream>> CreateStream() override {
    KC_RETURN_IF_ERROR(MakeCurrent());
    CUstream s = nullptr;
    if (CUresult r = api_->cuStreamCreate(&s, kStreamNonBlocking); r != kCudaSuccess) {
      return DriverError(r, "cuStreamCreate");
    }
    return std::unique_ptr<Stream>(std::make_unique<CudaStream>(this, api_, context_, s));
  }
  Stream& default_stream() override { return *default_stream_; }
  int threads() const override { return 1; }
  internal::KernelBackend& backend() override { return *this; }

  Status BindCallingThread() override { return MakeCurrent(); }

  // --- KernelBackend ---

  Status Copy(Stream& stream, internal::CopyKind kind, void* dst, const void* src,
              size_t size_bytes) override {
    KC_RETURN_IF_ERROR(MakeCurrent());
    const CUstream s = Handle(stream);
    CUresult r = kCudaSuccess;
    switch (kind) {
      case internal::CopyKind::kHostToDevice:
        r = api_->cuMemcpyHtoDAsync(Ptr(dst), src, size_bytes, s);
        break;
      case internal::CopyKind::kDeviceToHost:
        r = api_->cuMemcpyDtoHAsync(dst, Ptr(src), size_bytes, s);
        break;
      case internal::CopyKind::kDeviceToDevice:
        r = api_->cuMemcpyDtoDAsync(Ptr(dst), Ptr(src), size_bytes, s);
        break;
    }
    if (r != kCudaSuccess)
      return DriverError(r, "copy of " + std::to_string(size_bytes) + " bytes");
    return OkStatus();
  }

  // Waits for a host function enqueued behind the work, in slices, asking the stream between
  // them whether a fault broke it (then the host function would never run).
  Status Synchronize(Stream& stream, Duration timeout) override {
    KC_RETURN_IF_ERROR(MakeCurrent());
    const CUstream s = Handle(stream);
    // Shared with the callback, which may run after a timeout returned.
    auto* done = new std::shared_ptr<Notification>(std::make_shared<Notification>());
    std::shared_ptr<Notification> mine = *done;
    CUresult r = api_->cuLaunchHostFunc(
        s,
        [](void* p) {
          auto* n = static_cast<std::shared_ptr<Notification>*>(p);
          (*n)->Notify();
          delete n;
        },
        done);
    if (r != kCudaSuccess) {
      delete done;
      return DriverError(r, "synchronize");
    }
    Clock* clock = Clock::Real();
    const TimePoint deadline = clock->Now() + timeout;
    for (;;) {
      const TimePoint slice = std::min(deadline, clock->Now() + std::chrono::milliseconds(50));
      if (mine->WaitForNotificationWithDeadline(clock, slice)) break;
      const CUresult q = api_->cuStreamQuery(s);
      if (q != kCudaSuccess && q != kCudaErrorNotReady) {
        return DriverError(q, "synchronize");  // the callback will not run: `done` is left
      }
      if (clock->Now() >= deadline) {
        return DeadlineExceededError(
            "synchronize: the stream's work has not finished within " +
            std::to_string(std::chrono::duration<double>(timeout).count()) +
            " s (it keeps running)");
      }
    }
    const CUresult q = api_->cuStreamQuery(s);
    if (q != kCudaSuccess && q != kCudaErrorNotReady) return DriverError(q, "synchronize");
    return OkStatus();
  }

  Status SgemmStridedBatched(Stream& stream, const SgemmStridedBatchedOptions& o) override {
    KC_RETURN_IF_ERROR(MakeCurrent());
    KC_ASSIGN_OR_RETURN(const CublasApi* blas, Cublas());
    KC_ASSIGN_OR_RETURN(cublasHandle_t h, static_cast<CudaStream&>(stream).Blas());
    const SgemmOptions& g = o.gemm;
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    const cublasStatus_t s = blas->cublasSgemmStridedBatched(
        h, g.trans_b == Transpose::kYes ? kCublasOpT : kCublasOpN,
        g.trans_a == Transpose::kYes ? kCublasOpT : kCublasOpN, static_cast<int>(g.n),
        static_cast<int>(g.m), static_cast<int>(g.k), &g.alpha, g.b.data(), static_cast<int>(g.ldb),
        o.stride_b, g.a.data(), static_cast<int>(g.lda), o.stride_a, &g.beta, g.c.data(),
        static_cast<int>(g.ldc), o.stride_c, static_cast<int>(o.batch_count));
    if (s != kCublasSuccess) return CublasError(s, "cublasSgemmStridedBatched");
    return OkStatus();
  }

  Status Gemm(Stream& stream, const GemmOptions& o) override {
    KC_RETURN_IF_ERROR(MakeCurrent());
    KC_ASSIGN_OR_RETURN(const CublasApi* blas, Cublas());
    KC_ASSIGN_OR_RETURN(cublasHandle_t h, static_cast<CudaStream&>(stream).Blas());
    const int ab = o.ab_type == DataType::kBf16 ? kCudaR16BF : kCudaR32F;
    const int c = o.c_type == DataType::kBf16 ? kCudaR16BF : kCudaR32F;
    const cublasStatus_t s = blas->cublasGemmStridedBatchedEx(
        h, o.trans_b == Transpose::kYes ? kCublasOpT : kCublasOpN,
        o.trans_a == Transpose::kYes ? kCublasOpT : kCublasOpN, static_cast<int>(o.n),
        static_cast<int>(o.m), static_cast<int>(o.k), &o.alpha, o.b.data(), ab,
        static_cast<int>(o.ldb), o.stride_b, o.a.data(), ab, static_cast<int>(o.lda), o.stride_a,
        &o.beta, o.c.data(), c, static_cast<int>(o.ldc), o.stride_c,
        static_cast<int>(o.batch_count), kCublasCompute32F, kCublasGemmDefault);
    if (s != kCublasSuccess) return CublasError(s, "cublasGemmStridedBatchedEx");
    return OkStatus();
  }

  Status ReduceInto(Stream& stream, DataType type, ReduceOp op, void* dst, const void* src,
                    size_t count) override {
    const std::string name =
        "kc_reduce_" + std::string(DataTypeName(type)) + "_" + std::string(ReduceOpName(op));
    return LaunchElementwise(stream, name, count, dst, src, static_cast<unsigned long long>(count));
  }

  Status Scale(Stream& stream, DataType type, void* x, size_t count, double alpha) override {
    const unsigned long long n = count;
    if (type == DataType::kF64)
      return LaunchElementwise(stream, "kc_scale_f64", count, x, n, alpha);
    const float a = static_cast<float>(alpha);
    return LaunchElementwise(stream, type == DataType::kBf16 ? "kc_scale_bf16" : "kc_scale_f32",
                             count, x, n, a);
  }

  Status Axpy(Stream& stream, DataType type, void* y, double alpha, const void* x,
              size_t count) override {
    const unsigned long long n = count;
    if (type == DataType::kF64)
      return LaunchElementwise(stream, "kc_axpy_f64", count, y, alpha, x, n);
    const float a = static_cast<float>(alpha);
    return LaunchElementwise(stream, type == DataType::kBf16 ? "kc_axpy_bf16" : "kc_axpy_f32",
                             count, y, a, x, n);
  }

  Status Fill(Stream& stream, DataType type, void* x, size_t count, const void* value) override {
    const unsigned long long n = count;
    switch (DataTypeSize(type)) {
      case 2: {
        uint16_t v;
        std::memcpy(&v, value, 2);
        return LaunchElementwise(stream, "kc_fill_u16", count, x, n, v);
      }
      case 4: {
        uint32_t v;
        std::memcpy(&v, value, 4);
        return LaunchElementwise(stream, "kc_fill_u32", count, x, n, v);
      }
      default: {
        unsigned long long v;
        std::memcpy(&v, value, 8);
        return LaunchElementwise(stream, "kc_fill_u64", count, x, n, v);
      }
    }
  }

  Status Convert(Stream& stream, DataType dst_type, void* dst, DataType, const void* src,
                 size_t count) override {
    const unsigned long long n = count;
    return LaunchElementwise(
        stream, dst_type == DataType::kBf16 ? "kc_convert_f32_bf16" : "kc_convert_bf16_f32", count,
        dst, src, n);
  }

  Result<std::unique_ptr<KernelModule>> Compile(const KernelSource& source) override {
    KC_RETURN_IF_ERROR(MakeCurrent());
    KC_ASSIGN_OR_RETURN(std::string image, cuda::Compile(source, target_));
    CUmodule module = nullptr;
    CUresult r = api_->cuModuleLoadData(&module, image.data());
    if (r != kCudaSuccess && target_.cubin) {
      // A CUBIN this driver does not take (an NVRTC newer than the driver): PTX of the same
      // architecture, which the driver compiles itself, may still load.
      const CompileTarget ptx{.arch = "compute_" + target_.arch.substr(3), .cubin = false};
      KC_LOG(WARNING) << "cuda module load failed, trying ptx " << log::KV("module", source.name)
                      << " " << log::KV("error", DriverErrorText(r));
      KC_ASSIGN_OR_RETURN(image, cuda::Compile(source, ptx));
      r = api_->cuModuleLoadData(&module, image.data());
    }
    if (r != kCudaSuccess) {
      return DriverError(r, "load module " + source.name + " (" + target_.arch + ")");
    }
    return std::unique_ptr<KernelModule>(
        std::make_unique<CudaModule>(this, api_, context_, module, source.name));
  }

  Status Launch(Stream& stream, const KernelFunction& fn, const LaunchShape& shape,
                std::span<void* const> args) override {
    KC_RETURN_IF_ERROR(MakeCurrent());
    auto f = static_cast<CUfunction>(fn.handle);
    if (shape.shared_bytes > 48 * 1024) {
      // Above 48 KiB a kernel must opt in to its dynamic shared memory.
      if (CUresult r = api_->cuFuncSetAttribute(f, kFuncAttrMaxDynamicShared,
                                                static_cast<int>(shape.shared_bytes));
          r != kCudaSuccess) {
        return DriverError(r, "launch " + fn.name + ": " + std::to_string(shape.shared_bytes) +
                                  " bytes of shared memory");
      }
    }
    const CUresult r = api_->cuLaunchKernel(
        f, shape.grid_x, shape.grid_y, shape.grid_z, shape.block_x, shape.block_y, shape.block_z,
        shape.shared_bytes, Handle(stream), const_cast<void**>(args.data()), nullptr);
    if (r != kCudaSuccess) return DriverError(r, "launch " + fn.name);
    return OkStatus();
  }

 protected:
  Result<DeviceBuffer> AllocateImpl(size_t size_bytes, size_t alignment) override {
    // cuMemAlloc's blocks are aligned to at least 256 bytes.
    if (alignment > 256) {
      return InvalidArgumentError("allocate: alignment " + std::to_string(alignment) +
                                  " on a CUDA device: device memory comes 256-byte aligned");
    }
    KC_RETURN_IF_ERROR(MakeCurrent());
    CUdeviceptr p = 0;
    if (CUresult r = api_->cuMemAlloc(&p, size_bytes); r != kCudaSuccess) {
      size_t free_bytes = 0, total_bytes = 0;
      api_->cuMemGetInfo(&free_bytes, &total_bytes);
      return DriverError(r, "cuMemAlloc (" + std::to_string(free_bytes) + " of " +
                                std::to_string(total_bytes) + " bytes free)");
    }
    return MakeBuffer(reinterpret_cast<void*>(p), size_bytes, false);
  }

  void Free(void* data, size_t, bool) noexcept override {
    api_->cuCtxSetCurrent(context_);
    api_->cuMemFree(Ptr(data));  // synchronises with the device: the memory is not in use
  }

 private:
  Status MakeCurrent() {
    CUcontext current = nullptr;
    if (api_->cuCtxGetCurrent(&current) == kCudaSuccess && current == context_) return OkStatus();
    if (CUresult r = api_->cuCtxSetCurrent(context_); r != kCudaSuccess) {
      return DriverError(r, "cuCtxSetCurrent");
    }
    return OkStatus();
  }

  static CUstream Handle(Stream& stream) { return static_cast<CudaStream&>(stream).handle(); }

  // The element-wise kernel `name` over `count` elements, arguments as the kernel declares.
  template <typename... Args>
  Status LaunchElementwise(Stream& stream, const std::string& name, size_t count,
                           const Args&... args) {
    KC_ASSIGN_OR_RETURN(KernelFunction fn, Elementwise(name));
    const size_t blocks =
        std::min<size_t>((count + kBlock - 1) / kBlock, static_cast<size_t>(multiprocessors_) * 32);
    void* pointers[] = {const_cast<void*>(static_cast<const void*>(&args))...};
    return Launch(stream, fn, {.grid_x = static_cast<uint32_t>(blocks), .block_x = kBlock},
                  std::span<void* const>(pointers, sizeof...(Args)));
  }

  Result<KernelFunction> Elementwise(const std::string& name) {
    MutexLock lock(&functions_mu_);
    auto it = functions_.find(name);
    if (it != functions_.end()) return it->second;
    KC_ASSIGN_OR_RETURN(KernelFunction fn, elementwise_->Function(name));
    functions_.emplace(name, fn);
    return fn;
  }

  // Immutable after construction.
  const DriverApi* const api_;  // process lifetime
  const CUdevice device_;
  const CUcontext context_;  // the primary context, retained until destruction
  const int multiprocessors_;
  const CompileTarget target_;
  // Set by Init, then immutable.
  std::unique_ptr<Stream> default_stream_;
  std::unique_ptr<KernelModule> elementwise_;

  Mutex functions_mu_;
  std::unordered_map<std::string, KernelFunction> functions_ KC_GUARDED_BY(functions_mu_);
};

}  // namespace

KernelSource ElementwiseKernelSource() {
  return {.name = "hal_elementwise", .code = std::string(KernelPrelude()) + kElementwiseSource};
}

Result<int> CudaDeviceCount() {
  KC_ASSIGN_OR_RETURN(const DriverApi* api, Driver());
  int count = 0;
  if (CUresult r = api->cuDeviceGetCount(&count); r != kCudaSuccess) {
    return DriverError(r, "cuDeviceGetCount");
  }
  if (count == 0) return NotFoundError("the CUDA driver sees no device");
  return count;
}

Result<std::unique_ptr<ComputeDevice>> OpenCudaDevice(const DeviceDescriptor& descriptor,
                                                      const ComputeDeviceOptions&) {
  KC_ASSIGN_OR_RETURN(const DriverApi* api, Driver());
  const std::string where = "open device=" + descriptor.id;
  int count = 0;
  if (CUresult r = api->cuDeviceGetCount(&count); r != kCudaSuccess) {
    return DriverError(r, where + ": cuDeviceGetCount");
  }
  const int ordinal = descriptor.index_on_host;
  if (ordinal < 0 || ordinal >= count) {
    return NotFoundError(where + ": CUDA ordinal " + std::to_string(ordinal) + ", but " +
                         std::to_string(count) + " CUDA device(s) are visible");
  }
  CUdevice device = 0;
  if (CUresult r = api->cuDeviceGet(&device, ordinal); r != kCudaSuccess) {
    return DriverError(r, where + ": cuDeviceGet");
  }
  int major = 0, minor = 0, sms = 0;
  api->cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, device);
  api->cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, device);
  api->cuDeviceGetAttribute(&sms, kAttrMultiprocessorCount, device);
  KC_ASSIGN_OR_RETURN(CompileTarget target, TargetFor(major, minor));
  KC_RETURN_IF_ERROR(Cublas().status());
  CUcontext context = nullptr;
  if (CUresult r = api->cuDevicePrimaryCtxRetain(&context, device); r != kCudaSuccess) {
    return DriverError(r, where + ": cuDevicePrimaryCtxRetain");
  }
  auto d = std::make_unique<CudaDevice>(descriptor, api, device, context, std::max(sms, 1),
                                        std::move(target));
  KC_RETURN_IF_ERROR(d->Init().WithContext(where));
  char name[256] = {0};
  api->cuDeviceGetName(name, sizeof(name) - 1, device);
  KC_LOG(INFO) << "cuda device opened " << log::KV("ordinal", ordinal) << " "
               << log::KV("name", std::string(name)) << " "
               << log::KV("sm", std::to_string(major) + "." + std::to_string(minor));
  return std::unique_ptr<ComputeDevice>(std::move(d));
}

}  // namespace kc::hal::cuda
