#include "hal/cuda_probe.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "base/log.h"

namespace kc::hal {
namespace {

using ::testing::HasSubstr;

// An in-memory driver: GPUs by CUDA ordinal, an NVML view of them in its own order, the
// NVLinks of each and the peer-access matrix.
class FakeCudaDriver final : public CudaDriver {
 public:
  std::vector<CudaDeviceProperties> gpus;
  std::set<std::pair<int, int>> peer_access;  // (ordinal, peer) pairs that may access
  bool nvml = true;
  std::vector<int> nvml_order;                    // NVML index -> CUDA ordinal
  std::map<int, std::vector<NvlinkEnd>> nvlinks;  // CUDA ordinal -> its active links
  int fail_properties_of = -1;
  bool fail_nvml = false;

  Result<int> DeviceCount() override { return static_cast<int>(gpus.size()); }
  Result<CudaDeviceProperties> Properties(int ordinal) override {
    if (ordinal == fail_properties_of) return UnavailableError("cuDeviceGetName failed: 999");
    return gpus.at(ordinal);
  }
  Result<bool> CanAccessPeer(int ordinal, int peer) override {
    return peer_access.count({ordinal, peer}) > 0;
  }
  bool has_nvml() const override { return nvml; }
  Result<int> NvmlDeviceCount() override { return static_cast<int>(nvml_order.size()); }
  Result<PciAddress> NvmlPci(int index) override { return gpus.at(nvml_order.at(index)).pci; }
  Result<std::vector<NvlinkEnd>> NvmlActiveLinks(int index) override {
    if (fail_nvml) return UnavailableError("nvmlDeviceGetNvLinkState failed: 999");
    return nvlinks[nvml_order.at(index)];
  }

  void AddGpu(std::string name, int major, int minor, int sms, int clock_khz, int mem_clock_khz,
              int bus_bits, uint32_t pci_bus) {
    gpus.push_back({.name = std::move(name),
                    .total_memory_bytes = int64_t{80} << 30,
                    .multiprocessors = sms,
                    .clock_khz = clock_khz,
                    .memory_clock_khz = mem_clock_khz,
                    .memory_bus_width_bits = bus_bits,
                    .compute_capability_major = major,
                    .compute_capability_minor = minor,
                    .pci = {.domain = 0, .bus = pci_bus, .device = 0}});
  }
  void AddH100(uint32_t pci_bus) {
    AddGpu("NVIDIA H100 80GB HBM3", 9, 0, 132, 1980000, 2619000, 5120, pci_bus);
  }
  void ConnectDirect(int a, int b, int links) {
    for (int i = 0; i < links; ++i) {
      nvlinks[a].push_back({.kind = NvlinkEnd::Kind::kGpu, .pci = gpus[b].pci});
      nvlinks[b].push_back({.kind = NvlinkEnd::Kind::kGpu, .pci = gpus[a].pci});
    }
  }
  void AllPeers() {
    for (size_t a = 0; a < gpus.size(); ++a) {
      for (size_t b = 0; b < gpus.size(); ++b) {
        if (a != b) peer_access.insert({static_cast<int>(a), static_cast<int>(b)});
      }
    }
  }
};

const Link* FindLink(const CudaProbeResult& r, int a, int b) {
  for (const Link& l : r.links) {
    if (l.a == a && l.b == b) return &l;
  }
  return nullptr;
}

TEST(CudaProbeTest, TwoGpusWithNvlinkBetweenThem) {
  FakeCudaDriver driver;
  driver.AddH100(0x07);
  driver.AddH100(0x0f);
  driver.nvml_order = {0, 1};
  driver.ConnectDirect(0, 1, 18);
  driver.AllPeers();
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "node7");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 2u);
  const DeviceDescriptor& d = r->devices[1];
  EXPECT_EQ(d.id, "node7/gpu1");
  EXPECT_EQ(d.kind, DeviceKind::kCuda);
  EXPECT_EQ(d.model, "H100 80GB HBM3");
  EXPECT_EQ(d.host, "node7");
  EXPECT_EQ(d.index_on_host, 1);
  EXPECT_EQ(d.memory_bytes, int64_t{80} << 30);
  EXPECT_DOUBLE_EQ(d.peak_flops_fp32, 67e12);
  EXPECT_DOUBLE_EQ(d.peak_flops_bf16, 989e12);
  // 2619 MHz x 2 (DDR) x 5120 bits / 8 = 3.352 TB/s.
  EXPECT_DOUBLE_EQ(d.memory_bandwidth, 2619e6 * 2 * 640);
  ASSERT_EQ(r->links.size(), 1u);
  const Link* l = FindLink(*r, 0, 1);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->kind, LinkKind::kNvlink);
  EXPECT_DOUBLE_EQ(l->declared_bandwidth, 18 * 25e9);
  EXPECT_GT(l->declared_latency, 0);
  EXPECT_FALSE(l->measured_bandwidth.has_value());
  ASSERT_TRUE(r->host_default.has_value());
  EXPECT_EQ(r->host_default->kind, LinkKind::kPcie);
  EXPECT_GT(r->host_default->bandwidth, 0);
}

TEST(CudaProbeTest, TheResultBuildsATopology) {
  FakeCudaDriver driver;
  for (uint32_t bus = 1; bus <= 3; ++bus) driver.AddH100(bus);
  driver.nvml_order = {0, 1, 2};
  driver.ConnectDirect(0, 1, 18);
  driver.peer_access = {{0, 1}, {1, 0}};
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "node7");
  ASSERT_TRUE(r.ok()) << r.status();
  TopologySpec spec{.name = "node7",
                    .devices = r->devices,
                    .links = r->links,
                    .hosts = {{.name = "node7", .rack = "", .intra_host_default = r->host_default}},
                    .network = {}};
  Result<Topology> topology = Topology::Build(spec);
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_EQ(topology->Path(0, 1).kind, LinkKind::kNvlink);
  EXPECT_EQ(topology->Path(0, 2).kind, LinkKind::kPcie);
  EXPECT_LT(topology->Path(0, 2).bandwidth, topology->Path(0, 1).bandwidth);
}

TEST(CudaProbeTest, NvmlOrderIsMatchedToCudaOrdinalsByPciAddress) {
  // Four A100s; NVML lists them in another order. GPU 0 has 12 links to GPU 3 and none to
  // the others, which only reach each other over PCIe.
  FakeCudaDriver driver;
  for (uint32_t bus : {0x10u, 0x20u, 0x30u, 0x40u}) {
    driver.AddGpu("NVIDIA A100-SXM4-80GB", 8, 0, 108, 1410000, 1593000, 5120, bus);
  }
  driver.nvml_order = {3, 1, 0, 2};
  driver.ConnectDirect(0, 3, 12);
  driver.AllPeers();
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices[0].model, "A100-SXM4-80GB");
  EXPECT_DOUBLE_EQ(r->devices[0].peak_flops_fp32, 19.5e12);
  EXPECT_DOUBLE_EQ(r->devices[0].peak_flops_bf16, 312e12);
  ASSERT_EQ(r->links.size(), 6u);  // every pair: P2P works everywhere
  EXPECT_EQ(FindLink(*r, 0, 3)->kind, LinkKind::kNvlink);
  EXPECT_DOUBLE_EQ(FindLink(*r, 0, 3)->declared_bandwidth, 12 * 25e9);
  for (auto [a, b] : {std::pair{0, 1}, {0, 2}, {1, 2}, {1, 3}, {2, 3}}) {
    const Link* l = FindLink(*r, a, b);
    ASSERT_NE(l, nullptr) << a << "-" << b;
    EXPECT_EQ(l->kind, LinkKind::kPcie) << a << "-" << b;
    EXPECT_LT(l->declared_bandwidth, FindLink(*r, 0, 3)->declared_bandwidth);
  }
}

TEST(CudaProbeTest, GpusOnNvswitchesAreAllConnected) {
  FakeCudaDriver driver;
  for (uint32_t bus = 1; bus <= 4; ++bus) driver.AddH100(bus);
  driver.nvml_order = {0, 1, 2, 3};
  for (int g = 0; g < 4; ++g) {
    for (int i = 0; i < 18; ++i) {
      driver.nvlinks[g].push_back(
          {.kind = NvlinkEnd::Kind::kSwitch, .pci = {.domain = 0, .bus = 0xa0, .device = 0}});
    }
  }
  driver.nvlinks[3].resize(9);  // a GPU with half its links up bounds its pairs
  driver.AllPeers();
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->links.size(), 6u);
  for (const Link& l : r->links) {
    EXPECT_EQ(l.kind, LinkKind::kNvlink);
    EXPECT_DOUBLE_EQ(l.declared_bandwidth, (l.b == 3 ? 9 : 18) * 25e9);
  }
}

TEST(CudaProbeTest, WithoutNvmlPeersGetPcieAndOthersNoLink) {
  FakeCudaDriver driver;
  for (uint32_t bus = 1; bus <= 3; ++bus) driver.AddH100(bus);
  driver.nvml = false;
  driver.peer_access = {{0, 1}, {1, 0}, {1, 2}};  // 1->2 only one way: no link
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->links.size(), 1u);
  EXPECT_EQ(r->links[0].a, 0);
  EXPECT_EQ(r->links[0].b, 1);
  EXPECT_EQ(r->links[0].kind, LinkKind::kPcie);
  EXPECT_DOUBLE_EQ(r->links[0].declared_bandwidth, r->host_default->bandwidth);
}

TEST(CudaProbeTest, LinksToHiddenGpusAreIgnored) {
  // NVML sees a GPU that CUDA does not (CUDA_VISIBLE_DEVICES): its links do not count.
  FakeCudaDriver driver;
  driver.AddH100(1);
  driver.nvml_order = {0};
  driver.nvlinks[0] = {
      {.kind = NvlinkEnd::Kind::kGpu, .pci = {.domain = 0, .bus = 9, .device = 0}}};
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices.size(), 1u);
  EXPECT_TRUE(r->links.empty());
}

TEST(CudaProbeTest, UnknownModelsAreEstimatedWithALogLine) {
  FakeCudaDriver driver;
  driver.AddGpu("NVIDIA L40S", 8, 9, 142, 2520000, 2250000, 384, 1);
  driver.nvml_order = {0};
  log::StartCapture();
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  const std::string logs = log::StopCapture();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->devices[0].peak_flops_fp32, 256 * 142 * 2520e6);
  EXPECT_DOUBLE_EQ(r->devices[0].peak_flops_bf16, 1024 * 142 * 2520e6);
  EXPECT_THAT(logs, HasSubstr("estimated"));
  EXPECT_THAT(logs, HasSubstr("model=L40S"));
}

TEST(CudaProbeTest, AnArchitectureWithoutRatesGetsZeroFlops) {
  FakeCudaDriver driver;
  driver.AddGpu("NVIDIA Tesla K80", 3, 7, 13, 875000, 2505000, 384, 1);
  driver.nvml = false;
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices[0].peak_flops_fp32, 0);
  EXPECT_EQ(r->devices[0].peak_flops_bf16, 0);
}

TEST(CudaProbeTest, ADriverErrorIsReturnedWithTheDevice) {
  FakeCudaDriver driver;
  driver.AddH100(1);
  driver.AddH100(2);
  driver.fail_properties_of = 1;
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  EXPECT_EQ(r.status().code(), ErrorCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("cuda device 1"));
}

TEST(CudaProbeTest, AFailingNvmlIsLoggedAndLeavesPeerAccessLinks) {
  FakeCudaDriver driver;
  driver.AddH100(1);
  driver.AddH100(2);
  driver.nvml_order = {0, 1};
  driver.ConnectDirect(0, 1, 18);
  driver.AllPeers();
  driver.fail_nvml = true;
  log::StartCapture();
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  const std::string logs = log::StopCapture();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->links.size(), 1u);
  EXPECT_EQ(r->links[0].kind, LinkKind::kPcie);
  EXPECT_THAT(logs, HasSubstr("nvml query failed"));
}

TEST(CudaProbeTest, NoGpusGiveAnEmptyResult) {
  FakeCudaDriver driver;
  Result<CudaProbeResult> r = ProbeCudaDevices(driver, "h");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->devices.empty());
  EXPECT_TRUE(r->links.empty());
  EXPECT_FALSE(r->host_default.has_value());
}

TEST(CudaProbeTest, PciAddressesPrintLikeCuda) {
  EXPECT_EQ(PciAddressString({.domain = 0, .bus = 0x07, .device = 0}), "0000:07:00.0");
  EXPECT_EQ(PciAddressString({.domain = 1, .bus = 0xc1, .device = 0x1f}), "0001:c1:1f.0");
}

TEST(CudaProbeTest, WithoutLibcudaTheRealProbeIsEmptyWithOneLogLine) {
  if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(lib);
    GTEST_SKIP() << "libcuda.so.1 is installed here";
  }
  log::StartCapture();
  Result<CudaProbeResult> r = ProbeCuda("h");
  const std::string logs = log::StopCapture();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->devices.empty());
  EXPECT_TRUE(r->links.empty());
  EXPECT_EQ(std::count(logs.begin(), logs.end(), '\n'), 1) << logs;
  EXPECT_THAT(logs, HasSubstr("cuda not found"));
  EXPECT_EQ(LoadCudaDriver().status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kc::hal
