#include "parallel/planner/cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hal/inventory.h"

namespace kc::parallel::planner {
namespace {

using ::testing::HasSubstr;

hal::Topology Build(const std::string& yaml) {
  Result<hal::TopologySpec> spec = hal::LoadInventoryString(yaml, "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  Result<hal::Topology> t = hal::Topology::Build(*spec);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

constexpr char kTwoRacks[] = R"(name: two-racks
network: {cross_rack_bandwidth_factor: 0.5, cross_rack_latency_us: 2}
models:
  G:
    kind: simulated
    memory_gb: 80
    peak_tflops_fp32: 60
    peak_tflops_bf16: 900
    memory_bandwidth_gbs: 3000
hosts:
  - name: "a[0-1]"
    rack: ra
    model: G
    count: 8
    intra_host: {kind: nvlink, bandwidth_gbs: 400, latency_us: 2}
    network: {bandwidth_gbs: 50, latency_us: 4}
  - name: "b[0-1]"
    rack: rb
    model: G
    count: 8
    intra_host: {kind: nvlink, bandwidth_gbs: 400, latency_us: 2}
    network: {bandwidth_gbs: 50, latency_us: 4}
)";

TEST(ClusterFromTopologyTest, AHomogeneousGpuClusterKeepsItsFigures) {
  Result<PlannerCluster> c = ClusterFromTopology(Build(kTwoRacks));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spec.devices, 32);
  EXPECT_EQ(c->spec.devices_per_node, 8);
  EXPECT_FALSE(c->fp32);
  EXPECT_TRUE(c->simulated);
  EXPECT_EQ(c->device_model, "G");
  EXPECT_DOUBLE_EQ(c->spec.peak_flops, 900e12);
  EXPECT_DOUBLE_EQ(c->spec.memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(c->spec.memory_bandwidth, 3000e9);
  EXPECT_DOUBLE_EQ(c->spec.intra_node_bandwidth, 400e9);
  // Across the 2:1 spine: half the NIC.
  EXPECT_DOUBLE_EQ(c->spec.inter_node_bandwidth, 25e9);
  EXPECT_GT(c->spec.inter_node_latency, 4e-6);
  EXPECT_EQ(c->options.param_bytes, 2);  // mixed precision
  ASSERT_EQ(c->notes.size(), 1u);
  EXPECT_THAT(c->notes[0], HasSubstr("cross-rack"));

  // A non-blocking spine: racks cost nothing, and nothing is approximated.
  std::string flat = kTwoRacks;
  flat.replace(flat.find("0.5, cross_rack_latency_us: 2"), 29, "1, cross_rack_latency_us: 0");
  Result<PlannerCluster> f = ClusterFromTopology(Build(flat));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_DOUBLE_EQ(f->spec.inter_node_bandwidth, 50e9);
  EXPECT_TRUE(f->notes.empty());
}

TEST(ClusterFromTopologyTest, MixedDevicesAndCpuSlicesArePlannedAtTheWeakest) {
  constexpr char kMixed[] = R"(name: mixed
models:
  big: {kind: simulated, memory_gb: 80, peak_tflops_fp32: 60, peak_tflops_bf16: 900,
        memory_bandwidth_gbs: 3000}
  small: {kind: simulated, memory_gb: 40, peak_tflops_fp32: 20, peak_tflops_bf16: 0,
          memory_bandwidth_gbs: 1500}
hosts:
  - {name: h0, model: big, count: 4, network: {bandwidth_gbs: 25, latency_us: 5},
     intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2}}
  - {name: h1, model: small, count: 2, network: {bandwidth_gbs: 25, latency_us: 5},
     intra_host: {kind: pcie, bandwidth_gbs: 32, latency_us: 5}}
)";
  Result<PlannerCluster> c = ClusterFromTopology(Build(kMixed));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp32);  // "small" has no bf16: the engine trains in fp32
  EXPECT_EQ(c->device_model, "mixed (2 models)");
  EXPECT_DOUBLE_EQ(c->spec.peak_flops, 20e12);
  EXPECT_DOUBLE_EQ(c->spec.memory_bytes, 40e9);
  EXPECT_EQ(c->spec.devices_per_node, 2);
  EXPECT_DOUBLE_EQ(c->spec.intra_node_bandwidth, 32e9);
  EXPECT_EQ(c->options.param_bytes, 4);
  EXPECT_EQ(c->options.optimizer_bytes, 8);
  EXPECT_EQ(c->notes.size(), 2u);  // two models; hosts of 2 and 4
}

TEST(ClusterFromTopologyTest, OneDevicePerHostUsesTheNetworkOnly) {
  constexpr char kSingles[] = R"(name: singles
models:
  g: {kind: simulated, memory_gb: 16, peak_tflops_fp32: 10, peak_tflops_bf16: 100,
      memory_bandwidth_gbs: 900}
hosts:
  - {name: "n[0-3]", model: g, count: 1, network: {bandwidth_gbs: 12.5, latency_us: 5}}
)";
  Result<PlannerCluster> c = ClusterFromTopology(Build(kSingles));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spec.devices_per_node, 1);
  EXPECT_DOUBLE_EQ(c->spec.inter_node_bandwidth, 12.5e9);
  EXPECT_TRUE(c->notes.empty());
}

}  // namespace
}  // namespace kc::parallel::planner
