// CUDA GPUs of this host, found through the CUDA driver (libcuda.so.1) and NVML
// (libnvidia-ml.so.1), both loaded at run time with dlopen: CUDA is never a build
// dependency, and a host without it has no CUDA devices. Mapping and assumptions:
// docs/design/measurement.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "hal/device.h"
#include "hal/topology.h"

namespace kc::hal {

// A PCI function's address without the function number (GPUs are function 0).
struct PciAddress {
  uint32_t domain = 0;
  uint32_t bus = 0;
  uint32_t device = 0;
  friend bool operator==(const PciAddress&, const PciAddress&) = default;
};
std::string PciAddressString(const PciAddress& pci);  // "0000:07:00.0"

// What the CUDA driver reports about one GPU.
struct CudaDeviceProperties {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int64_t total_memory_bytes = 0;
  int multiprocessors = 0;
  int clock_khz = 0;         // peak SM clock
  int memory_clock_khz = 0;  // peak memory clock
  int memory_bus_width_bits = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  PciAddress pci;
};

// The far end of one active NVLink, as NVML reports it.
struct NvlinkEnd {
  enum class Kind : uint8_t { kGpu, kSwitch, kOther };
  Kind kind = Kind::kOther;
  PciAddress pci;  // for kGpu: the peer GPU
};

// The seam between the probe and the vendor libraries (as leveldb's Env): the real one
// forwards to libcuda and libnvidia-ml; tests pass a fake. GPUs are CUDA ordinals for the
// driver calls and NVML indices for the Nvml calls (the two orders may differ; the probe
// matches them by PCI address). Not thread-safe; owned by its caller.
class CudaDriver {
 public:
  virtual ~CudaDriver() = default;

  virtual Result<int> DeviceCount() = 0;
  virtual Result<CudaDeviceProperties> Properties(int ordinal) = 0;
  // Whether `ordinal` can read and write `peer`'s memory directly (cuDeviceCanAccessPeer).
  virtual Result<bool> CanAccessPeer(int ordinal, int peer) = 0;

  // False when NVML could not be loaded; the Nvml calls then return kUnavailable.
  virtual bool has_nvml() const = 0;
  virtual Result<int> NvmlDeviceCount() = 0;
  virtual Result<PciAddress> NvmlPci(int index) = 0;
  // One entry per active NVLink of the GPU at NVML index `index`.
  virtual Result<std::vector<NvlinkEnd>> NvmlActiveLinks(int index) = 0;
};

// Loads libcuda.so.1 and calls cuInit, then loads libnvidia-ml.so.1 and calls nvmlInit_v2
// if it can (logging one line when it cannot). kNotFound when libcuda.so.1 cannot be loaded
// or lacks a needed symbol (no CUDA driver here) or cuInit reports no device;
// kUnavailable when cuInit fails otherwise, with the CUresult. The result unloads both
// libraries when destroyed.
Result<std::unique_ptr<CudaDriver>> LoadCudaDriver();

struct CudaProbeResult {
  // Kind kCuda, ids "HOST/gpuN" with N the CUDA ordinal (= index_on_host).
  std::vector<DeviceDescriptor> devices;
  // Between GPUs of the host; a and b index `devices`. NVLink where NVML reports active
  // links between the two (directly or through NVSwitches), else PCIe where peer access
  // works both ways, else none (the pair uses host_default).
  std::vector<Link> links;
  // How GPUs without a link reach each other: PCIe through the host. Set when devices exist.
  std::optional<IntraHostDefault> host_default;
};

// Describes the GPUs `driver` reports, as devices of host `host`: model (the name without
// "NVIDIA "), memory, peak FLOP/s (a table of known models, else estimated from the
// multiprocessors, clock and compute capability, with a log line; 0 when the architecture
// is unknown), memory bandwidth (memory clock x bus width x 2), and the links between them.
// Returns the driver's error, with context, when a CUDA query fails; a failing NVML query
// is logged once and leaves NVLink undetected. Does only driver calls.
Result<CudaProbeResult> ProbeCudaDevices(CudaDriver& driver, std::string_view host);

// LoadCudaDriver + ProbeCudaDevices. A host without the CUDA driver, or whose driver sees
// no device, gets an empty result (not an error) and exactly one log line saying so.
// Other failures (cuInit errors, failing queries) are returned as errors.
Result<CudaProbeResult> ProbeCuda(std::string_view host);

}  // namespace kc::hal
