#include "hal/cpu/cpu_device.h"

#include <cblas.h>
#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/log.h"
#include "hal/cpu/cpu_kernels.h"
#include "hal/internal/kernel_backend.h"

namespace kc::hal::cpu {
namespace {

using log::KV;

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

// OpenBLAS's thread count is one per process; this remembers what the last opened CPU device
// set, to warn when a second device changes it. A counter-like flag: relaxed is enough.
std::atomic<int> g_blas_threads{0};

// Work runs when enqueued, so a CPU stream carries no state.
class CpuStream final : public Stream {
 public:
  explicit CpuStream(ComputeDevice* device) : Stream(device) {}
};

// A CPU slice. Safe for concurrent use (its state is immutable but for one atomic hint);
// each stream by one thread at a time.
class CpuDevice final : public ComputeDevice, public internal::KernelBackend {
 public:
  CpuDevice(const DeviceDescriptor& descriptor, TopologyPtr topology, BitmapPtr nodeset,
            int threads)
      : ComputeDevice(descriptor, DeviceId{DeviceKind::kCpu, descriptor.index_on_host}),
        topology_(std::move(topology)),
        nodeset_(std::move(nodeset)),
        threads_(threads),
        page_size_(static_cast<size_t>(sysconf(_SC_PAGESIZE))),
        physical_bytes_(static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page_size_),
        default_stream_(std::make_unique<CpuStream>(this)) {}

  ~CpuDevice() override {
    default_stream_.reset();
    CheckNothingLive();
  }

  Result<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(std::make_unique<CpuStream>(this));
  }
  Stream& default_stream() override { return *default_stream_; }
  int threads() const override { return threads_; }
  internal::KernelBackend& backend() override { return *this; }

  Status BindCallingThread() override {
    const std::vector<int>& cpus = descriptor().cpus;
    if (cpus.empty()) return OkStatus();
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : cpus) {
      if (cpu >= CPU_SETSIZE) {
        return FailedPreconditionError("bind: cpu " + std::to_string(cpu) + " >= CPU_SETSIZE");
      }
      CPU_SET(cpu, &set);
    }
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      return FailedPreconditionError("bind device=" + descriptor().id +
                                     ": sched_setaffinity: " + std::strerror(errno));
    }
    return OkStatus();
  }

  // KernelBackend. Each call runs to completion before returning.

  Status Copy(Stream&, internal::CopyKind, void* dst, const void* src, size_t size_bytes) override {
    std::memcpy(dst, src, size_bytes);
    return OkStatus();
  }

  Status Synchronize(Stream&, Duration) override { return OkStatus(); }

  Status SgemmStridedBatched(Stream&, const SgemmStridedBatchedOptions& o) override {
    const SgemmOptions& g = o.gemm;
    const auto trans = [](Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; };
    // With K == 0 the A and B extents are empty: keep their (possibly null) base pointers.
    const int64_t stride_a = g.k == 0 ? 0 : o.stride_a;
    const int64_t stride_b = g.k == 0 ? 0 : o.stride_b;
    // Dimensions were checked to fit blasint.
    for (int64_t i = 0; i < o.batch_count; ++i) {
      cblas_sgemm(CblasRowMajor, trans(g.trans_a), trans(g.trans_b), static_cast<blasint>(g.m),
                  static_cast<blasint>(g.n), static_cast<blasint>(g.k), g.alpha,
                  g.a.data() + i * stride_a, static_cast<blasint>(g.lda), g.b.data() + i * stride_b,
                  static_cast<blasint>(g.ldb), g.beta, g.c.data() + i * o.stride_c,
                  static_cast<blasint>(g.ldc));
    }
    return OkStatus();
  }

  Status ReduceInto(Stream&, DataType type, ReduceOp op, void* dst, const void* src,
                    size_t count) override {
    cpu::ReduceInto(type, op, dst, src, count);
    return OkStatus();
  }

  Status Scale(Stream&, DataType type, void* x, size_t count, double alpha) override {
    switch (type) {
      case DataType::kF32:
        cpu::Scale(static_cast<float*>(x), count, static_cast<float>(alpha));
        return OkStatus();
      case DataType::kF64:
        cpu::Scale(static_cast<double*>(x), count, alpha);
        return OkStatus();
      case DataType::kBf16:
        cpu::Scale(static_cast<Bf16*>(x), count, static_cast<float>(alpha));
        return OkStatus();
      default:
        return InternalError("scale: unsupported type reached the backend");
    }
  }

  Status Axpy(Stream&, DataType type, void* y, double alpha, const void* x, size_t count) override {
    switch (type) {
      case DataType::kF32:
        cpu::Axpy(static_cast<float*>(y), static_cast<float>(alpha), static_cast<const float*>(x),
                  count);
        return OkStatus();
      case DataType::kF64:
        cpu::Axpy(static_cast<double*>(y), alpha, static_cast<const double*>(x), count);
        return OkStatus();
      case DataType::kBf16:
        cpu::Axpy(static_cast<Bf16*>(y), static_cast<float>(alpha), static_cast<const Bf16*>(x),
                  count);
        return OkStatus();
      default:
        return InternalError("axpy: unsupported type reached the backend");
    }
  }

  Status Fill(Stream&, DataType type, void* x, size_t count, const void* value) override {
    switch (type) {
      case DataType::kF32:
        return FillTyped<float>(x, count, value);
      case DataType::kF64:
        return FillTyped<double>(x, count, value);
      case DataType::kI32:
        return FillTyped<int32_t>(x, count, value);
      case DataType::kI64:
        return FillTyped<int64_t>(x, count, value);
      case DataType::kBf16:
        return FillTyped<Bf16>(x, count, value);
    }
    return InternalError("fill: unknown type reached the backend");
  }

  Status Convert(Stream&, DataType dst_type, void* dst, DataType src_type, const void* src,
                 size_t count) override {
    if (dst_type == DataType::kBf16 && src_type == DataType::kF32) {
      cpu::ConvertF32ToBf16(static_cast<Bf16*>(dst), static_cast<const float*>(src), count);
      return OkStatus();
    }
    if (dst_type == DataType::kF32 && src_type == DataType::kBf16) {
      cpu::ConvertBf16ToF32(static_cast<float*>(dst), static_cast<const Bf16*>(src), count);
      return OkStatus();
    }
    return InternalError("convert: unsupported pair reached the backend");
  }

 protected:
  Result<DeviceBuffer> AllocateImpl(size_t size_bytes, size_t alignment) override {
    // Overcommit would hand out more than the host has and fail later, at first touch.
    if (size_bytes > physical_bytes_) {
      return ResourceExhaustedError("more than the host's physical memory");
    }
    // mmap'd pages are page-aligned; larger alignments come from the heap.
    if (nodeset_ != nullptr && alignment <= page_size_ &&
        membind_ok_.load(std::memory_order_relaxed)) {
      errno = 0;
      void* p = hwloc_alloc_membind(topology_.get(), size_bytes, nodeset_.get(), HWLOC_MEMBIND_BIND,
                                    HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
      if (p != nullptr) return MakeBuffer(p, size_bytes, /*numa_bound=*/true);
      const int err = errno;
      if (err == ENOMEM) return ResourceExhaustedError("out of memory");
      // Binding refused (a container without mbind, a node without memory): stop trying and
      // say so once.
      if (membind_ok_.exchange(false, std::memory_order_relaxed)) {
        KC_LOG(WARNING) << "numa binding refused, allocating from the heap "
                        << KV("device", descriptor().id) << " "
                        << KV("numa_node", descriptor().numa_node) << " "
                        << KV("error", std::string(std::strerror(err)));
      }
    }
    const size_t align = std::max(alignment, alignof(std::max_align_t));
    if (size_bytes > SIZE_MAX - (align - 1)) return ResourceExhaustedError("size overflows");
    const size_t rounded = (size_bytes + align - 1) & ~(align - 1);
    void* p = std::aligned_alloc(align, rounded);
    if (p == nullptr) return ResourceExhaustedError("out of memory");
    return MakeBuffer(p, size_bytes, /*numa_bound=*/false);
  }

  void Free(void* data, size_t size_bytes, bool numa_bound) noexcept override {
    if (numa_bound) {
      hwloc_free(topology_.get(), data, size_bytes);
    } else {
      std::free(data);
    }
  }

 private:
  template <typename T>
  static Status FillTyped(void* x, size_t count, const void* value) {
    std::fill_n(static_cast<T*>(x), count, *static_cast<const T*>(value));
    return OkStatus();
  }

  // Immutable after construction.
  const TopologyPtr topology_;
  const BitmapPtr nodeset_;  // the NUMA node to bind memory to; null: don't bind
  const int threads_;
  const size_t page_size_;
  const size_t physical_bytes_;
  // Cleared after the first refused binding; only a hint, so relaxed ordering.
  std::atomic<bool> membind_ok_{true};
  std::unique_ptr<CpuStream> default_stream_;
};

}  // namespace

Result<std::unique_ptr<ComputeDevice>> OpenCpuDevice(const DeviceDescriptor& descriptor,
                                                     const ComputeDeviceOptions& options) {
  const std::string where = "open cpu device=" + descriptor.id + ": ";
  if (descriptor.kind != DeviceKind::kCpu) return InvalidArgumentError(where + "not a CPU");
  if (options.threads < 0) {
    return InvalidArgumentError(where + "threads=" + std::to_string(options.threads) + " < 0");
  }
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return UnavailableError(where + "hwloc init failed");
  TopologyPtr topology(raw);
  if (hwloc_topology_load(topology.get()) != 0) {
    return UnavailableError(where + "hwloc topology load failed");
  }
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topology.get());
  for (int cpu : descriptor.cpus) {
    if (cpu < 0 || !hwloc_bitmap_isset(allowed, static_cast<unsigned>(cpu))) {
      return InvalidArgumentError(where + "cpu " + std::to_string(cpu) +
                                  " is not one this process may use");
    }
  }
  BitmapPtr nodeset;
  if (descriptor.numa_node >= 0) {
    if (hwloc_get_numanode_obj_by_os_index(
            topology.get(), static_cast<unsigned>(descriptor.numa_node)) == nullptr) {
      return InvalidArgumentError(where + "numa_node " + std::to_string(descriptor.numa_node) +
                                  " is not on this host");
    }
    const hwloc_topology_support* support = hwloc_topology_get_support(topology.get());
    if (support->membind->alloc_membind != 0 && support->membind->bind_membind != 0) {
      nodeset.reset(hwloc_bitmap_alloc());
      if (nodeset == nullptr) return ResourceExhaustedError(where + "hwloc bitmap");
      hwloc_bitmap_only(nodeset.get(), static_cast<unsigned>(descriptor.numa_node));
    } else {
      KC_LOG(INFO) << "numa binding unsupported here, allocating from the heap "
                   << KV("device", descriptor.id) << " " << KV("numa_node", descriptor.numa_node);
    }
  }
  int threads = options.threads;
  if (threads == 0) {
    threads = descriptor.cpus.empty() ? openblas_get_num_threads()
                                      : static_cast<int>(descriptor.cpus.size());
  }
  openblas_set_num_threads(threads);
  const int previous = g_blas_threads.exchange(threads, std::memory_order_relaxed);
  if (previous != 0 && previous != threads) {
    KC_LOG(WARNING) << "openblas thread count is process-wide; replacing an earlier device's "
                    << KV("device", descriptor.id) << " " << KV("threads", threads) << " "
                    << KV("previous", previous);
  }
  KC_VLOG(1) << "cpu device open " << KV("device", descriptor.id) << " " << KV("threads", threads)
             << " " << KV("numa_node", descriptor.numa_node) << " "
             << KV("membind", nodeset != nullptr);
  return std::unique_ptr<ComputeDevice>(
      std::make_unique<CpuDevice>(descriptor, std::move(topology), std::move(nodeset), threads));
}

}  // namespace kc::hal::cpu
