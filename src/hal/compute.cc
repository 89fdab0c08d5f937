#include "hal/compute.h"

#include <cstring>
#include <sstream>
#include <string>
#include <utility>

#include "base/layer_guard.h"
#include "hal/cpu/cpu_device.h"
#include "hal/cuda/cuda_device.h"
#include "hal/internal/kernel_backend.h"
#include "hal/internal/span_checks.h"

namespace kc::hal {

std::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kF32:
      return "f32";
    case DataType::kF64:
      return "f64";
    case DataType::kI32:
      return "i32";
    case DataType::kI64:
      return "i64";
    case DataType::kBf16:
      return "bf16";
  }
  return "invalid";
}

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kF32:
    case DataType::kI32:
      return 4;
    case DataType::kF64:
    case DataType::kI64:
      return 8;
    case DataType::kBf16:
      return 2;
  }
  return 0;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      numa_bound_(std::exchange(other.numa_bound_, false)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    numa_bound_ = std::exchange(other.numa_bound_, false);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (device_ == nullptr) return;
  if (data_ != nullptr) device_->Free(data_, size_bytes_, numa_bound_);
  device_->live_buffers_.fetch_sub(1, std::memory_order_relaxed);
  device_ = nullptr;
  data_ = nullptr;
  size_bytes_ = 0;
  numa_bound_ = false;
}

Stream::Stream(ComputeDevice* device) : device_(device) {
  device_->live_streams_.fetch_add(1, std::memory_order_relaxed);
}

Stream::~Stream() { device_->live_streams_.fetch_sub(1, std::memory_order_relaxed); }

ComputeDevice::ComputeDevice(DeviceDescriptor descriptor, DeviceId id)
    : descriptor_(std::move(descriptor)), id_(id) {}

ComputeDevice::~ComputeDevice() = default;

void ComputeDevice::CheckNothingLive() const {
  KC_CHECK(live_buffers() == 0 && live_streams() == 0)
      << "device " << descriptor_.id << " destroyed with " << live_buffers() << " buffers and "
      << live_streams() << " streams still live";
}

DeviceBuffer ComputeDevice::MakeBuffer(void* data, size_t size_bytes, bool numa_bound) {
  live_buffers_.fetch_add(1, std::memory_order_relaxed);
  return DeviceBuffer(this, data, size_bytes, numa_bound);
}

Result<DeviceBuffer> ComputeDevice::Allocate(size_t size_bytes, size_t alignment) {
  KC_LAYER_ENTRY(Layer::kHal, "compute");
  if (!std::has_single_bit(alignment)) {
    return InvalidArgumentError("allocate: alignment=" + std::to_string(alignment) +
                                " is not a power of two");
  }
  if (size_bytes == 0) return MakeBuffer(nullptr, 0, false);
  Result<DeviceBuffer> buffer = AllocateImpl(size_bytes, alignment);
  if (!buffer.ok()) {
    return buffer.status().WithContext("allocate device=" + descriptor_.id +
                                       " bytes=" + std::to_string(size_bytes));
  }
  return buffer;
}

Result<std::unique_ptr<ComputeDevice>> OpenComputeDevice(const DeviceDescriptor& descriptor,
                                                         const ComputeDeviceOptions& options) {
  KC_LAYER_ENTRY(Layer::kHal, "compute");
  switch (descriptor.kind) {
    case DeviceKind::kCpu:
      return cpu::OpenCpuDevice(descriptor, options);
    case DeviceKind::kCuda:
      return cuda::OpenCudaDevice(descriptor, options);
    case DeviceKind::kSimulated:
      return InvalidArgumentError("open device=" + descriptor.id +
                                  ": a simulated device runs nothing");
  }
  return InvalidArgumentError("open device=" + descriptor.id + ": unknown device kind");
}

namespace {

// Host memory: only the null-with-size rule applies.
Status CheckHostBytes(std::span<const std::byte> s, const char* name) {
  if (s.data() == nullptr && !s.empty()) {
    return InvalidArgumentError(std::string(name) + ": null pointer with size " +
                                std::to_string(s.size()));
  }
  return OkStatus();
}

Status CheckSameSize(size_t dst, size_t src) {
  if (dst != src) {
    return InvalidArgumentError("copy: dst has " + std::to_string(dst) + " bytes, src " +
                                std::to_string(src));
  }
  return OkStatus();
}

}  // namespace

Status CopyHostToDevice(Stream& stream, DeviceSpan<std::byte> dst, std::span<const std::byte> src) {
  KC_LAYER_ENTRY(Layer::kHal, "compute");
  KC_RETURN_IF_ERROR(internal::CheckSpan(stream, dst, "copy dst"));
  KC_RETURN_IF_ERROR(CheckHostBytes(src, "copy src"));
  KC_RETURN_IF_ERROR(CheckSameSize(dst.size(), src.size()));
  if (dst.empty()) return OkStatus();
  return stream.device().backend().Copy(stream, internal::CopyKind::kHostToDevice, dst.data(),
                                        src.data(), dst.size());
}

Status CopyDeviceToHost(Stream& stream, std::span<std::byte> dst, DeviceSpan<const std::byte> src) {
  KC_LAYER_ENTRY(Layer::kHal, "compute");
  KC_RETURN_IF_ERROR(CheckHostBytes(dst, "copy dst"));
  KC_RETURN_IF_ERROR(internal::CheckSpan(stream, src, "copy src"));
  KC_RETURN_IF_ERROR(CheckSameSize(dst.size(), src.size()));
  if (dst.empty()) return OkStatus();
  return stream.device().backend().Copy(stream, internal::CopyKind::kDeviceToHost, dst.data(),
                                        src.data(), dst.size());
}

Status CopyDeviceToDevice(Stream& stream, DeviceSpan<std::byte> dst,
                          DeviceSpan<const std::byte> src) {
  KC_LAYER_ENTRY(Layer::kHal, "compute");
  const DeviceId own = stream.device().id();
  // Either end may be the stream's device: the copy is a peer copy on CUDA.
  if (!dst.empty() && !src.empty() && dst.device() != own && src.device() != own) {
    return InvalidArgumentError("copy: neither dst nor src is on the stream's device");
  }
  KC_RETURN_IF_ERROR(internal::CheckSpanOn(dst, dst.device(), "copy dst"));
  KC_RETURN_IF_ERROR(internal::CheckSpanOn(src, src.device(), "copy src"));
  KC_RETURN_IF_ERROR(CheckSameSize(dst.size(), src.size()));
  if (dst.device().kind != src.device().kind && !dst.empty()) {
    return InvalidArgumentError("copy: dst and src are on devices of different kinds");
  }
  KC_RETURN_IF_ERROR(internal::CheckDisjoint(dst, src, "copy dst", "copy src"));
  if (dst.empty()) return OkStatus();
  return stream.device().backend().Copy(stream, internal::CopyKind::kDeviceToDevice, dst.data(),
                                        src.data(), dst.size());
}

Status Synchronize(Stream& stream, Duration timeout) {
  KC_LAYER_ENTRY(Layer::kHal, "compute");
  return stream.device().backend().Synchronize(stream, timeout);
}

}  // namespace kc::hal
