// The compute device interface: device memory, typed views over it, streams, and copies.
// Kernels (hal/kernels.h) run on a Stream of a ComputeDevice. The CPU backend lives in
// hal/cpu/, the CUDA backend in hal/cuda/ (docs/design/kernels.md, cuda-backend.md).
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>

#include "base/check.h"
#include "base/clock.h"
#include "base/status.h"
#include "hal/device.h"

namespace kc::hal {

class ComputeDevice;
namespace internal {
class KernelBackend;  // hal/internal/kernel_backend.h
}  // namespace internal

// bfloat16: the upper 16 bits of an IEEE fp32, stored as uint16_t. A distinct type so that a
// bf16 buffer cannot be reduced as 16-bit integers by mistake. Trivial; compares bitwise.
struct Bf16 {
  uint16_t bits;
  friend constexpr bool operator==(Bf16 a, Bf16 b) = default;
};
static_assert(sizeof(Bf16) == 2 && std::is_trivial_v<Bf16>);

// Exact: every bf16 is an fp32.
constexpr float Bf16ToFloat(Bf16 x) { return std::bit_cast<float>(uint32_t{x.bits} << 16); }

// Rounds to nearest, ties to even. NaN stays NaN of the same sign (made quiet, so a
// signalling NaN whose payload lies only in the dropped bits does not become inf); values
// past the largest bf16 round to +-inf, as IEEE rounding does.
constexpr Bf16 FloatToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return Bf16{static_cast<uint16_t>(is_nan ? quiet_nan : rounded)};
}

// Element types device kernels know.
enum class DataType : uint8_t {
  kF32 = 0,
  kF64 = 1,
  kI32 = 2,
  kI64 = 3,
  kBf16 = 4,  // Bf16 above
};
std::string_view DataTypeName(DataType type);  // "f32", "f64", "i32", "i64", "bf16"
size_t DataTypeSize(DataType type);            // bytes per element; 0 for an invalid value

// DataTypeOf<T>::value: the DataType of float, double, int32_t, int64_t and Bf16.
template <typename T>
struct DataTypeOf;
template <>
struct DataTypeOf<float> : std::integral_constant<DataType, DataType::kF32> {};
template <>
struct DataTypeOf<double> : std::integral_constant<DataType, DataType::kF64> {};
template <>
struct DataTypeOf<int32_t> : std::integral_constant<DataType, DataType::kI32> {};
template <>
struct DataTypeOf<int64_t> : std::integral_constant<DataType, DataType::kI64> {};
template <>
struct DataTypeOf<Bf16> : std::integral_constant<DataType, DataType::kBf16> {};

// Names one device of this process: what a DeviceSpan records so a kernel can refuse memory
// of another device. A plain value.
struct DeviceId {
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;  // CPU: the slice's index_on_host; CUDA: the CUDA device ordinal
  friend bool operator==(DeviceId a, DeviceId b) = default;
  // CPU memory is host memory; CUDA device memory is not.
  bool host_accessible() const { return kind == DeviceKind::kCpu; }
};

// A view of `size` elements of T in the memory of one device: pointer + count + device. For
// a CUDA device the pointer is a device pointer the host must not dereference. Never owns;
// the memory must outlive every use of the view (including work enqueued on a stream).
// On a CPU device any host pointer is a device pointer: DeviceSpan(v.data(), v.size(), id).
template <typename T>
class DeviceSpan {
 public:
  using element_type = T;

  constexpr DeviceSpan() = default;
  constexpr DeviceSpan(T* data, size_t size, DeviceId device)
      : data_(data), size_(size), device_(device) {}
  // DeviceSpan<T> converts to DeviceSpan<const T>.
  template <typename U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>) constexpr DeviceSpan(
      DeviceSpan<U> other)  // NOLINT: implicit like std::span's
      : data_(other.data()), size_(other.size()), device_(other.device()) {}

  constexpr T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr size_t size_bytes() const { return size_ * sizeof(T); }
  constexpr bool empty() const { return size_ == 0; }
  constexpr DeviceId device() const { return device_; }

  // REQUIRES: offset + count <= size().
  DeviceSpan subspan(size_t offset, size_t count) const {
    KC_CHECK(offset <= size_ && count <= size_ - offset)
        << "subspan offset=" << offset << " count=" << count << " size=" << size_;
    return DeviceSpan(data_ + offset, count, device_);
  }
  DeviceSpan first(size_t count) const { return subspan(0, count); }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  DeviceId device_;
};

// The bytes a span covers, as std::as_bytes and std::as_writable_bytes do for std::span.
template <typename T>
DeviceSpan<const std::byte> AsBytes(DeviceSpan<T> s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size_bytes(), s.device()};
}
template <typename T>
requires(!std::is_const_v<T>) DeviceSpan<std::byte> AsWritableBytes(DeviceSpan<T> s) {
  return {reinterpret_cast<std::byte*>(s.data()), s.size_bytes(), s.device()};
}

// The host's view of device memory. REQUIRES: s.device().host_accessible() (a CPU device);
// a CUDA pointer is not readable from the host, copy it with CopyDeviceToHost instead.
template <typename T>
std::span<T> AsHostSpan(DeviceSpan<T> s) {
  KC_CHECK(s.device().host_accessible()) << "AsHostSpan of device memory";
  return std::span<T>(s.data(), s.size());
}

// Memory allocated by ComputeDevice::Allocate; freed when destroyed. Move-only. The device
// must outlive it (the device CHECKs that no buffer is live when destroyed). Not
// thread-safe; the memory it owns follows the stream-ordering rules of the device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // empty: no memory, size 0
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  // nullptr for an empty buffer.
  ComputeDevice* device() const { return device_; }
  // Whether the pages are bound to the device's NUMA node (CPU devices; false elsewhere).
  bool numa_bound() const { return numa_bound_; }

  // The whole buffer as size_bytes() / sizeof(T) elements of T (the tail is cut off).
  // REQUIRES: data() is aligned for T (always true for alignments >= alignof(T)).
  template <typename T>
  DeviceSpan<T> As() const;
  DeviceSpan<std::byte> bytes() const { return As<std::byte>(); }

  // Frees the memory now; the buffer becomes empty.
  void Reset();

 private:
  friend class ComputeDevice;
  DeviceBuffer(ComputeDevice* device, void* data, size_t size_bytes, bool numa_bound)
      : device_(device), data_(data), size_bytes_(size_bytes), numa_bound_(numa_bound) {}

  ComputeDevice* device_ = nullptr;  // outlives this buffer (see the class comment)
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
  bool numa_bound_ = false;
};

// An ordered queue of work on one device. Work enqueued on a stream (copies and kernels,
// which all take a Stream&) runs in the order enqueued; work on different streams may
// overlap. The CPU backend runs each operation to completion before the enqueuing call
// returns; a CUDA backend returns once the work is queued. Callers write to the stricter
// contract: a buffer handed to enqueued work stays valid and unchanged until
// Synchronize(stream) returns. Not thread-safe: one thread enqueues at a time. The device
// must outlive it (CHECKed).
class Stream {
 public:
  virtual ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  ComputeDevice& device() const { return *device_; }

 protected:
  explicit Stream(ComputeDevice* device);

 private:
  ComputeDevice* const device_;  // outlives this stream (see the class comment)
};

struct ComputeDeviceOptions {
  // Threads the device's BLAS uses for one call. 0: one per cpu of the slice
  // (descriptor.cpus), or the BLAS library's current setting when the slice lists none.
  // On CPU this is OpenBLAS's thread count, which is process-wide: the last device opened
  // wins (one rank per process makes that one device; docs/design/kernels.md).
  int threads = 0;
};

// A device that owns memory and runs kernels: a CPU slice through OpenBLAS and plain loops,
// later a CUDA GPU. Created by OpenComputeDevice. Allocate, CreateStream and the accessors
// are safe for concurrent use; each Stream is used by one thread at a time.
class ComputeDevice {
 public:
  static constexpr size_t kDefaultAlignment = 64;

  virtual ~ComputeDevice();
  ComputeDevice(const ComputeDevice&) = delete;
  ComputeDevice& operator=(const ComputeDevice&) = delete;

  const DeviceDescriptor& descriptor() const { return descriptor_; }
  DeviceId id() const { return id_; }

  // Allocates `size_bytes` of device memory aligned to `alignment` bytes; contents are
  // unspecified. On CPU the pages are bound to the descriptor's NUMA node where the OS
  // allows it (a page-granular mmap per call: allocate arenas, not tensors), else come from
  // the heap (logged once per device). size_bytes == 0 gives an empty buffer.
  // kInvalidArgument when alignment is not a power of two; kResourceExhausted when the
  // memory is not there (on CPU also for more than the host's physical memory, which
  // overcommit would otherwise grant). Does not block on streams.
  Result<DeviceBuffer> Allocate(size_t size_bytes, size_t alignment = kDefaultAlignment);

  // A new stream of this device. kResourceExhausted when the backend has no more.
  virtual Result<std::unique_ptr<Stream>> CreateStream() = 0;
  // The stream that exists for the device's whole life.
  virtual Stream& default_stream() = 0;

  // Threads one BLAS call uses (ComputeDeviceOptions::threads after defaults).
  virtual int threads() const = 0;

  // Makes the calling thread this device's: on CPU pins it to descriptor.cpus (nothing when
  // the slice lists none); on CUDA selects the device for the thread. Never implicit.
  // kFailedPrecondition when the OS refuses (the cpus left this process's cpuset).
  virtual Status BindCallingThread() = 0;

  // The backend's kernel entry points, for hal/kernels.cc and hal/compute.cc. Callers use
  // the free functions, which validate arguments first.
  virtual internal::KernelBackend& backend() = 0;

  // Buffers and streams of this device not yet destroyed.
  int64_t live_buffers() const { return live_buffers_.load(std::memory_order_relaxed); }
  int64_t live_streams() const { return live_streams_.load(std::memory_order_relaxed); }

 protected:
  ComputeDevice(DeviceDescriptor descriptor, DeviceId id);

  // Allocate after its checks: size_bytes > 0, alignment a power of two.
  virtual Result<DeviceBuffer> AllocateImpl(size_t size_bytes, size_t alignment) = 0;
  // Frees what AllocateImpl returned through MakeBuffer.
  virtual void Free(void* data, size_t size_bytes, bool numa_bound) noexcept = 0;
  DeviceBuffer MakeBuffer(void* data, size_t size_bytes, bool numa_bound);
  // Backends call this first in their destructor: no buffer or stream may outlive them.
  void CheckNothingLive() const;

 private:
  friend class DeviceBuffer;
  friend class Stream;

  // Immutable after construction.
  const DeviceDescriptor descriptor_;
  const DeviceId id_;
  // Counters only, read for the lifetime CHECK: relaxed ordering is enough, since the
  // owner destroys the device after every buffer and stream (happens-before via its own
  // synchronisation).
  std::atomic<int64_t> live_buffers_{0};
  std::atomic<int64_t> live_streams_{0};
};

// Opens the device `descriptor` names on this host. kCpu: a CPU slice (its cpus must be
// ones this process may use, its numa_node one of this host's or -1); kCuda: the GPU of CUDA
// ordinal index_on_host, through the driver, NVRTC and cuBLAS loaded at run time (kNotFound
// when they or the device are not here, hal/cuda/cuda_device.h); kSimulated: kInvalidArgument
// (nothing runs on it). kUnavailable when the host topology cannot be read. Takes
// milliseconds (CPU) or a fraction of a second (CUDA: it compiles its element-wise kernels).
Result<std::unique_ptr<ComputeDevice>> OpenComputeDevice(const DeviceDescriptor& descriptor,
                                                         const ComputeDeviceOptions& options = {});

// Copies, stream-ordered. The stream's device must be the device of the device-side span(s)
// (for device to device: one of the two). Sizes must be equal; device to device ranges must
// not overlap. kInvalidArgument otherwise (also for a null pointer with a nonzero size).
// The host memory must stay valid and unchanged until Synchronize(stream).
Status CopyHostToDevice(Stream& stream, DeviceSpan<std::byte> dst, std::span<const std::byte> src);
Status CopyDeviceToHost(Stream& stream, std::span<std::byte> dst, DeviceSpan<const std::byte> src);
Status CopyDeviceToDevice(Stream& stream, DeviceSpan<std::byte> dst,
                          DeviceSpan<const std::byte> src);

template <typename T>
Status CopyHostToDevice(Stream& stream, DeviceSpan<T> dst,
                        std::span<const std::type_identity_t<T>> src) {
  return CopyHostToDevice(stream, AsWritableBytes(dst), std::as_bytes(src));
}
template <typename T>
Status CopyDeviceToHost(Stream& stream, std::span<T> dst,
                        DeviceSpan<const std::type_identity_t<T>> src) {
  return CopyDeviceToHost(stream, std::as_writable_bytes(dst), AsBytes(src));
}
template <typename T>
Status CopyDeviceToDevice(Stream& stream, DeviceSpan<T> dst,
                          DeviceSpan<const std::type_identity_t<T>> src) {
  return CopyDeviceToDevice(stream, AsWritableBytes(dst), AsBytes(src));
}

// Blocks until all work enqueued on `stream` so far has finished. Returns the first error
// that work hit while executing (a CUDA backend reports launch and execution faults here;
// argument errors are returned by the enqueuing call itself), kDeadlineExceeded when the
// work has not finished within `timeout` (it keeps running). On CPU returns at once.
Status Synchronize(Stream& stream, Duration timeout);

// Template definitions.

template <typename T>
DeviceSpan<T> DeviceBuffer::As() const {
  KC_CHECK(reinterpret_cast<uintptr_t>(data_) % alignof(T) == 0) << "misaligned As<T>()";
  const DeviceId id = device_ != nullptr ? device_->id() : DeviceId{};
  return DeviceSpan<T>(static_cast<T*>(data_), size_bytes_ / sizeof(T), id);
}

}  // namespace kc::hal
