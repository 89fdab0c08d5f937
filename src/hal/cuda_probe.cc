#include "hal/cuda_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "base/layer_guard.h"
#include "base/log.h"

namespace kc::hal {
namespace {

// ---------------------------------------------------------------------------------------
// The few declarations we need, written out so that CUDA is never a build dependency.
// Values as documented in the CUDA driver API header cuda.h (CUresult, CUdevice_attribute)
// and the NVML header nvml.h (nvmlReturn_t, nvmlEnableState_t, nvmlPciInfo_t,
// nvmlIntNvLinkDeviceType_t, NVML_NVLINK_MAX_LINKS); these values are part of NVIDIA's
// stable ABI.

using CUresult = int;  // enum cudaError_enum
using CUdevice = int;
constexpr CUresult kCudaSuccess = 0;          // CUDA_SUCCESS
constexpr CUresult kCudaErrorNoDevice = 100;  // CUDA_ERROR_NO_DEVICE
// enum CUdevice_attribute
constexpr int kAttrClockRate = 13;               // CU_DEVICE_ATTRIBUTE_CLOCK_RATE, kHz
constexpr int kAttrMultiprocessorCount = 16;     // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrPciBusId = 33;                // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
constexpr int kAttrPciDeviceId = 34;             // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
constexpr int kAttrMemoryClockRate = 36;         // CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, kHz
constexpr int kAttrGlobalMemoryBusWidth = 37;    // CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH
constexpr int kAttrPciDomainId = 50;             // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID
constexpr int kAttrComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

using nvmlReturn_t = int;                     // enum nvmlReturn_enum
using nvmlDevice_t = void*;                   // struct nvmlDevice_st*
constexpr nvmlReturn_t kNvmlSuccess = 0;      // NVML_SUCCESS
constexpr int kNvmlFeatureEnabled = 1;        // NVML_FEATURE_ENABLED (nvmlEnableState_t)
constexpr unsigned kNvmlNvlinkMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (12 before CUDA 11.x)
// nvmlIntNvLinkDeviceType_t
constexpr int kNvmlNvlinkDeviceTypeGpu = 0;     // NVML_NVLINK_DEVICE_TYPE_GPU
constexpr int kNvmlNvlinkDeviceTypeSwitch = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH
// nvmlPciInfo_t (the layout used by nvmlDeviceGetPciInfo_v3 and
// nvmlDeviceGetNvLinkRemotePciInfo_v2).
struct NvmlPciInfo {
  char bus_id_legacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
};

// The dlsym'd entry points.
struct CudaApi {
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice device);
  CUresult (*cuDeviceTotalMem)(size_t* bytes, CUdevice device);  // cuDeviceTotalMem_v2
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  CUresult (*cuDeviceCanAccessPeer)(int* can_access, CUdevice device, CUdevice peer);
};

struct NvmlApi {
  nvmlReturn_t (*nvmlInit)();  // nvmlInit_v2
  nvmlReturn_t (*nvmlShutdown)();
  nvmlReturn_t (*nvmlDeviceGetCount)(unsigned int* count);  // nvmlDeviceGetCount_v2
  nvmlReturn_t (*nvmlDeviceGetHandleByIndex)(unsigned int index,
                                             nvmlDevice_t* device);             // ..._v2
  nvmlReturn_t (*nvmlDeviceGetPciInfo)(nvmlDevice_t device, NvmlPciInfo* pci);  // ..._v3
  nvmlReturn_t (*nvmlDeviceGetNvLinkState)(nvmlDevice_t device, unsigned int link, int* is_active);
  nvmlReturn_t (*nvmlDeviceGetNvLinkRemotePciInfo)(nvmlDevice_t device, unsigned int link,
                                                   NvmlPciInfo* pci);  // ..._v2
  // Optional (older drivers lack it): then only links to visible GPUs are recognised.
  nvmlReturn_t (*nvmlDeviceGetNvLinkRemoteDeviceType)(nvmlDevice_t device, unsigned int link,
                                                      int* type);
};

struct DlCloser {
  void operator()(void* handle) const { dlclose(handle); }
};
using Library = std::unique_ptr<void, DlCloser>;

template <typename Fn>
bool Bind(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return *fn != nullptr;
}

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlerror";
}

Status CudaError(std::string_view call, CUresult r) {
  return UnavailableError("cuda: " + std::string(call) + " failed with CUresult " +
                          std::to_string(r));
}

Status NvmlError(std::string_view call, nvmlReturn_t r) {
  return UnavailableError("nvml: " + std::string(call) + " failed with nvmlReturn_t " +
                          std::to_string(r));
}

// The real driver: forwards to the dlopen'ed libraries.
class DlCudaDriver final : public CudaDriver {
 public:
  DlCudaDriver(Library cuda, CudaApi cu, Library nvml, NvmlApi nv)
      : cuda_(std::move(cuda)), cu_(cu), nvml_(std::move(nvml)), nv_(nv) {}
  ~DlCudaDriver() override {
    if (nvml_ != nullptr) nv_.nvmlShutdown();
  }
  DlCudaDriver(const DlCudaDriver&) = delete;
  DlCudaDriver& operator=(const DlCudaDriver&) = delete;

  Result<int> DeviceCount() override {
    int n = 0;
    if (CUresult r = cu_.cuDeviceGetCount(&n); r != kCudaSuccess) {
      return CudaError("cuDeviceGetCount", r);
    }
    return n;
  }

  Result<CudaDeviceProperties> Properties(int ordinal) override {
    CUdevice dev = 0;
    if (CUresult r = cu_.cuDeviceGet(&dev, ordinal); r != kCudaSuccess) {
      return CudaError("cuDeviceGet", r);
    }
    CudaDeviceProperties p;
    char name[256] = {};
    if (CUresult r = cu_.cuDeviceGetName(name, sizeof(name) - 1, dev); r != kCudaSuccess) {
      return CudaError("cuDeviceGetName", r);
    }
    p.name = name;
    size_t bytes = 0;
    if (CUresult r = cu_.cuDeviceTotalMem(&bytes, dev); r != kCudaSuccess) {
      return CudaError("cuDeviceTotalMem_v2", r);
    }
    p.total_memory_bytes = static_cast<int64_t>(bytes);
    int domain = 0, bus = 0, device = 0;
    const std::pair<int, int*> attributes[] = {
        {kAttrMultiprocessorCount, &p.multiprocessors},
        {kAttrClockRate, &p.clock_khz},
        {kAttrMemoryClockRate, &p.memory_clock_khz},
        {kAttrGlobalMemoryBusWidth, &p.memory_bus_width_bits},
        {kAttrComputeCapabilityMajor, &p.compute_capability_major},
        {kAttrComputeCapabilityMinor, &p.compute_capability_minor},
        {kAttrPciDomainId, &domain},
        {kAttrPciBusId, &bus},
        {kAttrPciDeviceId, &device},
    };
    for (const auto& [attribute, out] : attributes) {
      if (CUresult r = cu_.cuDeviceGetAttribute(out, attribute, dev); r != kCudaSuccess) {
        return CudaError("cuDeviceGetAttribute(" + std::to_string(attribute) + ")", r);
      }
    }
    p.pci = {static_cast<uint32_t>(domain), static_cast<uint32_t>(bus),
             static_cast<uint32_t>(device)};
    return p;
  }

  Result<bool> CanAccessPeer(int ordinal, int peer) override {
    CUdevice a = 0, b = 0;
    if (CUresult r = cu_.cuDeviceGet(&a, ordinal); r != kCudaSuccess) {
      return CudaError("cuDeviceGet", r);
    }
    if (CUresult r = cu_.cuDeviceGet(&b, peer); r != kCudaSuccess) {
      return CudaError("cuDeviceGet", r);
    }
    int can = 0;
    if (CUresult r = cu_.cuDeviceCanAccessPeer(&can, a, b); r != kCudaSuccess) {
      return CudaError("cuDeviceCanAccessPeer", r);
    }
    return can != 0;
  }

  bool has_nvml() const override { return nvml_ != nullptr; }

  Result<int> NvmlDeviceCount() override {
    if (nvml_ == nullptr) return UnavailableError("nvml: not loaded");
    unsigned int n = 0;
    if (nvmlReturn_t r = nv_.nvmlDeviceGetCount(&n); r != kNvmlSuccess) {
      return NvmlError("nvmlDeviceGetCount_v2", r);
    }
    return static_cast<int>(n);
  }

  Result<PciAddress> NvmlPci(int index) override {
    KC_ASSIGN_OR_RETURN(nvmlDevice_t dev, Handle(index));
    NvmlPciInfo pci = {};
    if (nvmlReturn_t r = nv_.nvmlDeviceGetPciInfo(dev, &pci); r != kNvmlSuccess) {
      return NvmlError("nvmlDeviceGetPciInfo_v3", r);
    }
    return PciAddress{pci.domain, pci.bus, pci.device};
  }

  Result<std::vector<NvlinkEnd>> NvmlActiveLinks(int index) override {
    KC_ASSIGN_OR_RETURN(nvmlDevice_t dev, Handle(index));
    std::vector<NvlinkEnd> ends;
    for (unsigned link = 0; link < kNvmlNvlinkMaxLinks; ++link) {
      int active = 0;
      // A GPU without NVLink, or with fewer links, answers NOT_SUPPORTED or
      // INVALID_ARGUMENT for the links it lacks: those are simply not active.
      if (nv_.nvmlDeviceGetNvLinkState(dev, link, &active) != kNvmlSuccess) continue;
      if (active != kNvmlFeatureEnabled) continue;
      NvlinkEnd end;
      int type = -1;
      if (nv_.nvmlDeviceGetNvLinkRemoteDeviceType != nullptr &&
          nv_.nvmlDeviceGetNvLinkRemoteDeviceType(dev, link, &type) == kNvmlSuccess) {
        end.kind = type == kNvmlNvlinkDeviceTypeGpu      ? NvlinkEnd::Kind::kGpu
                   : type == kNvmlNvlinkDeviceTypeSwitch ? NvlinkEnd::Kind::kSwitch
                                                         : NvlinkEnd::Kind::kOther;
      } else {
        end.kind = NvlinkEnd::Kind::kGpu;  // assumed; checked against the GPUs' addresses
      }
      NvmlPciInfo pci = {};
      if (nv_.nvmlDeviceGetNvLinkRemotePciInfo(dev, link, &pci) == kNvmlSuccess) {
        end.pci = {pci.domain, pci.bus, pci.device};
      } else if (end.kind == NvlinkEnd::Kind::kGpu) {
        end.kind = NvlinkEnd::Kind::kOther;  // a GPU we cannot identify
      }
      ends.push_back(end);
    }
    return ends;
  }

 private:
  Result<nvmlDevice_t> Handle(int index) {
    if (nvml_ == nullptr) return UnavailableError("nvml: not loaded");
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t r = nv_.nvmlDeviceGetHandleByIndex(static_cast<unsigned>(index), &dev);
        r != kNvmlSuccess) {
      return NvmlError("nvmlDeviceGetHandleByIndex_v2", r);
    }
    return dev;
  }

  // Immutable after construction. The libraries stay loaded while the pointers are used.
  Library cuda_;
  CudaApi cu_;
  Library nvml_;  // null when NVML is absent
  NvmlApi nv_;
};

// Loads NVML if present; a null library (with one log line) when it is not.
std::pair<Library, NvmlApi> LoadNvml() {
  NvmlApi nv = {};
  Library lib(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL));
  if (lib == nullptr) {
    KC_LOG(INFO) << "nvml not found, NVLink links not detected "
                 << log::KV("library", "libnvidia-ml.so.1") << " " << log::KV("error", DlError());
    return {nullptr, nv};
  }
  const bool bound =
      Bind(lib.get(), "nvmlInit_v2", &nv.nvmlInit) &&
      Bind(lib.get(), "nvmlShutdown", &nv.nvmlShutdown) &&
      Bind(lib.get(), "nvmlDeviceGetCount_v2", &nv.nvmlDeviceGetCount) &&
      Bind(lib.get(), "nvmlDeviceGetHandleByIndex_v2", &nv.nvmlDeviceGetHandleByIndex) &&
      Bind(lib.get(), "nvmlDeviceGetPciInfo_v3", &nv.nvmlDeviceGetPciInfo) &&
      Bind(lib.get(), "nvmlDeviceGetNvLinkState", &nv.nvmlDeviceGetNvLinkState) &&
      Bind(lib.get(), "nvmlDeviceGetNvLinkRemotePciInfo_v2", &nv.nvmlDeviceGetNvLinkRemotePciInfo);
  if (!bound) {
    KC_LOG(WARNING) << "nvml lacks a needed symbol, NVLink links not detected "
                    << log::KV("error", DlError());
    return {nullptr, nv};
  }
  Bind(lib.get(), "nvmlDeviceGetNvLinkRemoteDeviceType", &nv.nvmlDeviceGetNvLinkRemoteDeviceType);
  if (nvmlReturn_t r = nv.nvmlInit(); r != kNvmlSuccess) {
    KC_LOG(WARNING) << "nvml init failed, NVLink links not detected " << log::KV("nvml_return", r);
    return {nullptr, nv};
  }
  return {std::move(lib), nv};
}

// ---------------------------------------------------------------------------------------
// From what the driver reports to descriptors and links.

struct KnownModel {
  std::string_view name_part;  // matched against the CUDA name, first match wins
  double fp32;                 // FLOP/s, dense, datasheet
  double bf16;
};
constexpr KnownModel kKnownModels[] = {
    {"H100 PCIe", 51e12, 756e12}, {"H100 NVL", 60e12, 835e12}, {"H100", 67e12, 989e12},
    {"H200 NVL", 60e12, 835e12},  {"H200", 67e12, 989e12},     {"A100", 19.5e12, 312e12},
};

// FLOP per clock per multiprocessor: FP32 (an FMA counts 2) and dense BF16 tensor-core
// rates by compute capability; 0 where unknown (bf16: no bf16 arithmetic before sm_80).
struct SmRates {
  double fp32;
  double bf16;
};
SmRates RatesFor(int major, int minor) {
  const int cc = major * 10 + minor;
  if (cc == 60) return {128, 0};
  if (cc >= 61 && cc <= 62) return {256, 0};
  if (cc >= 70 && cc <= 75) return {128, 0};
  if (cc == 80) return {128, 2048};
  if (cc >= 86 && cc <= 89) return {256, 1024};
  if (cc == 90) return {256, 4096};
  if (cc == 100) return {256, 8192};
  if (cc > 100) return {256, 0};
  return {0, 0};
}

// NVLink bandwidth per link per direction: NVLink 1 (sm_60) 20 GB/s, NVLink 2-4 (Volta,
// Ampere, Hopper) 25 GB/s, NVLink 5 (Blackwell) 50 GB/s.
double NvlinkBandwidthPerLink(int major) {
  if (major < 6) return 0;
  if (major == 6) return 20e9;
  if (major >= 10) return 50e9;
  return 25e9;
}

// PCIe x16 per direction, by the generation a GPU of this architecture has: gen5 from
// Hopper, gen4 for Ampere/Ada, gen3 before.
double PcieBandwidth(int major) {
  if (major >= 9) return 63e9;
  if (major == 8) return 31.5e9;
  return 15.75e9;
}

constexpr double kNvlinkLatency = 2e-6;  // seconds; declared, replaced by measurement
constexpr double kPcieLatency = 5e-6;

std::string ModelName(std::string_view name) {
  constexpr std::string_view kPrefix = "NVIDIA ";
  if (name.starts_with(kPrefix)) name.remove_prefix(kPrefix.size());
  return std::string(name);
}

DeviceDescriptor Describe(const CudaDeviceProperties& p, std::string_view host, int ordinal) {
  DeviceDescriptor d;
  d.id = std::string(host) + "/gpu" + std::to_string(ordinal);
  d.kind = DeviceKind::kCuda;
  d.model = ModelName(p.name);
  d.host = std::string(host);
  d.index_on_host = ordinal;
  d.memory_bytes = p.total_memory_bytes;
  // DDR signalling: two transfers per memory clock, bus width in bits.
  d.memory_bandwidth =
      static_cast<double>(p.memory_clock_khz) * 1e3 * 2 * p.memory_bus_width_bits / 8;
  const auto known = std::find_if(
      std::begin(kKnownModels), std::end(kKnownModels),
      [&](const KnownModel& m) { return p.name.find(m.name_part) != std::string::npos; });
  if (known != std::end(kKnownModels)) {
    d.peak_flops_fp32 = known->fp32;
    d.peak_flops_bf16 = known->bf16;
    return d;
  }
  const SmRates rates = RatesFor(p.compute_capability_major, p.compute_capability_minor);
  const double sm_clocks = static_cast<double>(p.multiprocessors) * p.clock_khz * 1e3;
  d.peak_flops_fp32 = rates.fp32 * sm_clocks;
  d.peak_flops_bf16 = rates.bf16 * sm_clocks;
  KC_LOG(INFO) << "cuda model not in the peak FLOP/s table, estimated " << log::KV("device", d.id)
               << " " << log::KV("model", d.model) << " "
               << log::KV("compute_capability", std::to_string(p.compute_capability_major) + "." +
                                                    std::to_string(p.compute_capability_minor))
               << " " << log::KV("sms", p.multiprocessors) << " "
               << log::KV("clock_mhz", p.clock_khz / 1000) << " "
               << log::KV("fp32_tflops", d.peak_flops_fp32 / 1e12) << " "
               << log::KV("bf16_tflops", d.peak_flops_bf16 / 1e12);
  return d;
}

}  // namespace

std::string PciAddressString(const PciAddress& pci) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.0", pci.domain, pci.bus, pci.device);
  return buf;
}

Result<std::unique_ptr<CudaDriver>> LoadCudaDriver() {
  KC_LAYER_ENTRY(Layer::kHal, "cuda_probe");
  Library cuda(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL));
  if (cuda == nullptr) return NotFoundError("cuda: cannot load libcuda.so.1: " + DlError());
  CudaApi cu = {};
  const bool bound = Bind(cuda.get(), "cuInit", &cu.cuInit) &&
                     Bind(cuda.get(), "cuDeviceGetCount", &cu.cuDeviceGetCount) &&
                     Bind(cuda.get(), "cuDeviceGet", &cu.cuDeviceGet) &&
                     Bind(cuda.get(), "cuDeviceGetName", &cu.cuDeviceGetName) &&
                     Bind(cuda.get(), "cuDeviceTotalMem_v2", &cu.cuDeviceTotalMem) &&
                     Bind(cuda.get(), "cuDeviceGetAttribute", &cu.cuDeviceGetAttribute) &&
                     Bind(cuda.get(), "cuDeviceCanAccessPeer", &cu.cuDeviceCanAccessPeer);
  if (!bound) return NotFoundError("cuda: libcuda.so.1 lacks a needed symbol: " + DlError());
  if (CUresult r = cu.cuInit(0); r != kCudaSuccess) {
    if (r == kCudaErrorNoDevice) return NotFoundError("cuda: the driver reports no device");
    return CudaError("cuInit", r);
  }
  auto [nvml, nv] = LoadNvml();
  return std::unique_ptr<CudaDriver>(
      std::make_unique<DlCudaDriver>(std::move(cuda), cu, std::move(nvml), nv));
}

Result<CudaProbeResult> ProbeCudaDevices(CudaDriver& driver, std::string_view host) {
  KC_LAYER_ENTRY(Layer::kHal, "cuda_probe");
  CudaProbeResult result;
  KC_ASSIGN_OR_RETURN(const int count, driver.DeviceCount());
  std::vector<CudaDeviceProperties> props;
  for (int i = 0; i < count; ++i) {
    Result<CudaDeviceProperties> p = driver.Properties(i);
    if (!p.ok()) return p.status().WithContext("cuda device " + std::to_string(i));
    result.devices.push_back(Describe(*p, host, i));
    props.push_back(*std::move(p));
  }
  if (count == 0) return result;

  // NVLinks between each pair (by CUDA ordinal), and each GPU's links to NVSwitches.
  std::vector<std::vector<int>> nvlinks(count, std::vector<int>(count, 0));
  std::vector<int> switch_links(count, 0);
  auto ordinal_of = [&](const PciAddress& pci) {
    for (int i = 0; i < count; ++i) {
      if (props[i].pci == pci) return i;
    }
    return -1;  // not a GPU visible to CUDA here (hidden, or not a GPU)
  };
  // NVML only refines the links: when it fails, say so once and fall back to peer access.
  auto read_nvlinks = [&]() -> Status {
    KC_ASSIGN_OR_RETURN(const int nvml_count, driver.NvmlDeviceCount());
    for (int n = 0; n < nvml_count; ++n) {
      KC_ASSIGN_OR_RETURN(const PciAddress pci, driver.NvmlPci(n));
      const int i = ordinal_of(pci);
      if (i < 0) continue;
      Result<std::vector<NvlinkEnd>> ends = driver.NvmlActiveLinks(n);
      if (!ends.ok()) return ends.status().WithContext("nvml device " + PciAddressString(pci));
      for (const NvlinkEnd& end : *ends) {
        if (end.kind == NvlinkEnd::Kind::kSwitch) {
          ++switch_links[i];
        } else if (end.kind == NvlinkEnd::Kind::kGpu) {
          const int j = ordinal_of(end.pci);
          if (j >= 0 && j != i) ++nvlinks[i][j];
        }
      }
    }
    return OkStatus();
  };
  if (driver.has_nvml()) {
    if (Status s = read_nvlinks(); !s.ok()) {
      KC_LOG(WARNING) << "nvml query failed, NVLink links not detected "
                      << log::KV("status", s.ToString());
      for (auto& row : nvlinks) std::fill(row.begin(), row.end(), 0);
      std::fill(switch_links.begin(), switch_links.end(), 0);
    }
  }

  int min_major = props[0].compute_capability_major;
  for (const CudaDeviceProperties& p : props) {
    min_major = std::min(min_major, p.compute_capability_major);
  }
  for (int a = 0; a < count; ++a) {
    for (int b = a + 1; b < count; ++b) {
      const int major =
          std::min(props[a].compute_capability_major, props[b].compute_capability_major);
      // Through NVSwitches every GPU reaches every other over all its switch links; the
      // slower end bounds the pair.
      const int links =
          std::max(nvlinks[a][b], nvlinks[b][a]) + std::min(switch_links[a], switch_links[b]);
      if (links > 0 && NvlinkBandwidthPerLink(major) > 0) {
        result.links.push_back({.a = a,
                                .b = b,
                                .kind = LinkKind::kNvlink,
                                .declared_bandwidth = links * NvlinkBandwidthPerLink(major),
                                .declared_latency = kNvlinkLatency,
                                .measured_bandwidth = std::nullopt,
                                .measured_latency = std::nullopt});
        continue;
      }
      KC_ASSIGN_OR_RETURN(const bool ab, driver.CanAccessPeer(a, b));
      KC_ASSIGN_OR_RETURN(const bool ba, driver.CanAccessPeer(b, a));
      if (ab && ba) {
        result.links.push_back({.a = a,
                                .b = b,
                                .kind = LinkKind::kPcie,
                                .declared_bandwidth = PcieBandwidth(major),
                                .declared_latency = kPcieLatency,
                                .measured_bandwidth = std::nullopt,
                                .measured_latency = std::nullopt});
      }
    }
  }
  result.host_default = IntraHostDefault{
      .kind = LinkKind::kPcie, .bandwidth = PcieBandwidth(min_major), .latency = kPcieLatency};
  return result;
}

Result<CudaProbeResult> ProbeCuda(std::string_view host) {
  KC_LAYER_ENTRY(Layer::kHal, "cuda_probe");
  Result<std::unique_ptr<CudaDriver>> driver = LoadCudaDriver();
  if (!driver.ok()) {
    if (driver.status().code() != ErrorCode::kNotFound) return driver.status();
    KC_LOG(INFO) << "cuda not found, no CUDA devices "
                 << log::KV("reason", driver.status().message());
    return CudaProbeResult{};
  }
  return ProbeCudaDevices(**driver, host);
}

}  // namespace kc::hal
