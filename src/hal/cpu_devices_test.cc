#include "hal/cpu_devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kc::hal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// A host of `nodes` NUMA nodes with `cores_per_node` cores each, numbered consecutively.
HostInfo MakeHost(int nodes, int cores_per_node, int64_t memory_per_node) {
  HostInfo info;
  info.hostname = "box";
  info.cpu_model = "Test CPU 9000";
  info.packages = nodes;
  info.cores = nodes * cores_per_node;
  info.pus = info.cores;
  info.memory_bytes = nodes * memory_per_node;
  for (int n = 0; n < nodes; ++n) {
    NumaNode node{.os_index = n, .memory_bytes = memory_per_node, .cpus = {}};
    for (int c = 0; c < cores_per_node; ++c) node.cpus.push_back(n * cores_per_node + c);
    info.numa_nodes.push_back(node);
  }
  return info;
}

TEST(CpuSliceTest, OneNodeOfTwoCoresIsOneDeviceByDefault) {
  Result<std::vector<DeviceDescriptor>> devices = MakeCpuDevices(MakeHost(1, 2, 8 * kGiB), {});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  const DeviceDescriptor& d = (*devices)[0];
  EXPECT_EQ(d.id, "box/cpu0");
  EXPECT_EQ(d.kind, DeviceKind::kCpu);
  EXPECT_EQ(d.model, "Test CPU 9000");
  EXPECT_EQ(d.host, "box");
  EXPECT_EQ(d.index_on_host, 0);
  EXPECT_EQ(d.numa_node, 0);
  EXPECT_THAT(d.cpus, ElementsAre(0, 1));
  EXPECT_EQ(d.memory_bytes, 8 * kGiB);
  EXPECT_EQ(d.peak_flops_fp32, 0);
  EXPECT_EQ(d.peak_flops_bf16, 0);
  EXPECT_EQ(d.memory_bandwidth, 0);
}

TEST(CpuSliceTest, OneNodeOfTwoCoresSplitsIntoTwoDevices) {
  Result<std::vector<DeviceDescriptor>> devices =
      MakeCpuDevices(MakeHost(1, 2, 8 * kGiB), {.num_devices = 2, .measured = {}});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0].id, "box/cpu0");
  EXPECT_EQ((*devices)[1].id, "box/cpu1");
  EXPECT_EQ((*devices)[1].index_on_host, 1);
  EXPECT_THAT((*devices)[0].cpus, ElementsAre(0));
  EXPECT_THAT((*devices)[1].cpus, ElementsAre(1));
  EXPECT_EQ((*devices)[0].memory_bytes, 4 * kGiB);
  EXPECT_EQ((*devices)[1].memory_bytes, 4 * kGiB);
}

TEST(CpuSliceTest, TwoNodesOfFourCoresAreTwoDevicesByDefault) {
  Result<std::vector<DeviceDescriptor>> devices = MakeCpuDevices(MakeHost(2, 4, 16 * kGiB), {});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_THAT((*devices)[0].cpus, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT((*devices)[1].cpus, ElementsAre(4, 5, 6, 7));
  EXPECT_EQ((*devices)[0].numa_node, 0);
  EXPECT_EQ((*devices)[1].numa_node, 1);
  EXPECT_EQ((*devices)[0].memory_bytes, 16 * kGiB);
  EXPECT_EQ((*devices)[1].memory_bytes, 16 * kGiB);
}

TEST(CpuSliceTest, TwoNodesOfFourCoresSplitIntoFourDevicesWithinNodes) {
  Result<std::vector<DeviceDescriptor>> devices =
      MakeCpuDevices(MakeHost(2, 4, 16 * kGiB), {.num_devices = 4, .measured = {}});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 4u);
  const int expected_node[] = {0, 0, 1, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT((*devices)[i].cpus, ElementsAre(2 * i, 2 * i + 1));
    EXPECT_EQ((*devices)[i].numa_node, expected_node[i]);
    EXPECT_EQ((*devices)[i].memory_bytes, 8 * kGiB);
  }
}

TEST(CpuSliceTest, RemainderGoesToTheFirstSlicesAndMemoryFollowsTheCores) {
  // 8 cores over 3 slices: 3, 3, 2. Slice 1 holds cpu 3 (node 0) and cpus 4, 5 (node 1).
  Result<std::vector<DeviceDescriptor>> devices =
      MakeCpuDevices(MakeHost(2, 4, 16 * kGiB), {.num_devices = 3, .measured = {}});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 3u);
  EXPECT_THAT((*devices)[0].cpus, ElementsAre(0, 1, 2));
  EXPECT_THAT((*devices)[1].cpus, ElementsAre(3, 4, 5));
  EXPECT_THAT((*devices)[2].cpus, ElementsAre(6, 7));
  EXPECT_EQ((*devices)[0].numa_node, 0);
  EXPECT_EQ((*devices)[1].numa_node, 1);  // two of its three cores
  EXPECT_EQ((*devices)[2].numa_node, 1);
  EXPECT_EQ((*devices)[0].memory_bytes, 12 * kGiB);
  EXPECT_EQ((*devices)[1].memory_bytes, 4 * kGiB + 8 * kGiB);
  EXPECT_EQ((*devices)[2].memory_bytes, 8 * kGiB);
}

TEST(CpuSliceTest, SevenCoresOverThreeSlicesSpreadTheRemainder) {
  Result<std::vector<DeviceDescriptor>> devices =
      MakeCpuDevices(MakeHost(1, 7, 7 * kGiB), {.num_devices = 3, .measured = {}});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 3u);
  EXPECT_THAT((*devices)[0].cpus, ElementsAre(0, 1, 2));
  EXPECT_THAT((*devices)[1].cpus, ElementsAre(3, 4));
  EXPECT_THAT((*devices)[2].cpus, ElementsAre(5, 6));
  int64_t memory = 0;
  for (const DeviceDescriptor& d : *devices) memory += d.memory_bytes;
  EXPECT_EQ(memory, 7 * kGiB);
  EXPECT_EQ((*devices)[0].memory_bytes, 3 * kGiB);
}

TEST(CpuSliceTest, MoreDevicesThanCoresIsAnInvalidArgumentNamingTheFlag) {
  Result<std::vector<DeviceDescriptor>> devices =
      MakeCpuDevices(MakeHost(1, 2, kGiB), {.num_devices = 3, .measured = {}});
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(devices.status().message(), HasSubstr("--cpu-devices"));
}

TEST(CpuSliceTest, NegativeDeviceCountIsAnInvalidArgument) {
  Result<std::vector<DeviceDescriptor>> devices =
      MakeCpuDevices(MakeHost(1, 2, kGiB), {.num_devices = -1, .measured = {}});
  EXPECT_EQ(devices.status().code(), ErrorCode::kInvalidArgument);
}

TEST(CpuSliceTest, AHostWithoutCoresIsAnInvalidArgument) {
  HostInfo info = MakeHost(1, 2, kGiB);
  info.numa_nodes[0].cpus.clear();
  EXPECT_EQ(MakeCpuDevices(info, {}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(CpuSliceTest, MeasuredFiguresScaleWithTheSliceCores) {
  CpuDeviceOptions options{.num_devices = 3,
                           .measured = {.memory_bandwidth_per_core = 10e9,
                                        .flops_fp32_per_core = 100e9,
                                        .shm_bandwidth = 5e9,
                                        .shm_latency = 1e-6}};
  Result<std::vector<DeviceDescriptor>> devices = MakeCpuDevices(MakeHost(1, 7, kGiB), options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_DOUBLE_EQ((*devices)[0].memory_bandwidth, 30e9);
  EXPECT_DOUBLE_EQ((*devices)[0].peak_flops_fp32, 300e9);
  EXPECT_DOUBLE_EQ((*devices)[2].memory_bandwidth, 20e9);
  EXPECT_DOUBLE_EQ((*devices)[2].peak_flops_fp32, 200e9);
  EXPECT_EQ((*devices)[2].peak_flops_bf16, 0);
}

TEST(CpuSliceTest, TopologySpecHasTheSlicesAndASharedMemoryHostDefault) {
  CpuDeviceOptions options{.num_devices = 2,
                           .measured = {.memory_bandwidth_per_core = 10e9,
                                        .flops_fp32_per_core = 100e9,
                                        .shm_bandwidth = 5e9,
                                        .shm_latency = 1e-6}};
  Result<TopologySpec> spec = MakeCpuTopologySpec(MakeHost(1, 2, kGiB), options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "box");
  EXPECT_EQ(spec->devices.size(), 2u);
  EXPECT_TRUE(spec->links.empty());
  ASSERT_EQ(spec->hosts.size(), 1u);
  EXPECT_EQ(spec->hosts[0].name, "box");
  ASSERT_TRUE(spec->hosts[0].intra_host_default.has_value());
  const IntraHostDefault& shm = *spec->hosts[0].intra_host_default;
  EXPECT_EQ(shm.kind, LinkKind::kSharedMemory);
  EXPECT_EQ(shm.bandwidth, kConservativeIntraHostBandwidth);
  EXPECT_EQ(shm.latency, kConservativeIntraHostLatency);
  EXPECT_EQ(shm.measured_bandwidth, 5e9);
  EXPECT_EQ(shm.measured_latency, 1e-6);
  EXPECT_DOUBLE_EQ(shm.effective_bandwidth(), 5e9);

  // Measured values make a spec that Topology::Build accepts.
  Result<Topology> topology = Topology::Build(*spec);
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_EQ(topology->Path(0, 1).kind, LinkKind::kSharedMemory);
  EXPECT_DOUBLE_EQ(topology->Path(0, 1).bandwidth, 5e9);
  EXPECT_DOUBLE_EQ(topology->Path(0, 1).latency, 1e-6);
}

TEST(CpuSliceTest, AnUnmeasuredHostDefaultIsConservativeAndUnmeasured) {
  HostSpec host = MakeCpuHostSpec(MakeHost(1, 2, kGiB), {});
  EXPECT_EQ(host.name, "box");
  ASSERT_TRUE(host.intra_host_default.has_value());
  EXPECT_EQ(host.intra_host_default->kind, LinkKind::kSharedMemory);
  EXPECT_GT(host.intra_host_default->bandwidth, 0);
  EXPECT_FALSE(host.intra_host_default->measured_bandwidth.has_value());
  EXPECT_FALSE(host.intra_host_default->measured_latency.has_value());
}

TEST(CpuSliceTest, TopologySpecPassesOnTheDeviceError) {
  Result<TopologySpec> spec =
      MakeCpuTopologySpec(MakeHost(1, 2, kGiB), {.num_devices = 5, .measured = {}});
  EXPECT_EQ(spec.status().code(), ErrorCode::kInvalidArgument);
}

TEST(CpuSliceTest, TheProbedHostYieldsAtLeastOneSlice) {
  Result<HostInfo> info = ProbeHost();
  ASSERT_TRUE(info.ok()) << info.status();
  Result<std::vector<DeviceDescriptor>> devices = MakeCpuDevices(*info, {});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_GE(devices->size(), 1u);
  size_t cpus = 0;
  for (const DeviceDescriptor& d : *devices) cpus += d.cpus.size();
  EXPECT_EQ(cpus, static_cast<size_t>(info->pus));
}

}  // namespace
}  // namespace kc::hal
