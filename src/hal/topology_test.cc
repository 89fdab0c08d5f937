#include "hal/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hal/topology_admin.h"

namespace kc::hal {
namespace {

using ::testing::HasSubstr;

constexpr double kNvlinkBandwidth = 300e9;
constexpr double kNvlinkLatency = 2e-6;
constexpr double kPcieBandwidth = 32e9;
constexpr double kPcieLatency = 5e-6;
constexpr double kNetworkBandwidth = 12.5e9;
constexpr double kNetworkLatency = 5e-6;
constexpr double kMemoryBandwidth = 3e12;

// "hosts x devices_per_host" clusters; host h is "h<h>", its devices "h<h>/gpu<i>" (or cpu).
struct Shape {
  int hosts = 1;
  int devices_per_host = 8;
  int racks = 0;  // 0: none declared; else the hosts split evenly over racks "r0", "r1", ...
  std::optional<IntraHostDefault> intra =
      IntraHostDefault{.kind = LinkKind::kNvlink,
                       .bandwidth = kNvlinkBandwidth,
                       .latency = kNvlinkLatency};  // NVSwitch: every pair at NVLink speed
  DeviceKind kind = DeviceKind::kSimulated;
  double network_bandwidth = kNetworkBandwidth;
  double cross_rack_factor = 1.0;
  double cross_rack_latency = 0;
};

TopologySpec MakeSpec(const Shape& s) {
  TopologySpec spec;
  spec.name = "test";
  spec.network = {.cross_rack_bandwidth_factor = s.cross_rack_factor,
                  .cross_rack_latency = s.cross_rack_latency};
  for (int h = 0; h < s.hosts; ++h) {
    HostSpec host{.name = "h" + std::to_string(h), .intra_host_default = s.intra};
    if (s.racks > 0) host.rack = "r" + std::to_string(h * s.racks / s.hosts);
    for (int i = 0; i < s.devices_per_host; ++i) {
      DeviceDescriptor d;
      d.id = host.name + (s.kind == DeviceKind::kCpu ? "/cpu" : "/gpu") + std::to_string(i);
      d.kind = s.kind;
      d.model = "test-accelerator";
      d.host = host.name;
      d.index_on_host = i;
      d.memory_bytes = int64_t{80} << 30;
      d.peak_flops_fp32 = 60e12;
      d.peak_flops_bf16 = 1e15;
      d.memory_bandwidth = kMemoryBandwidth;
      d.network_bandwidth = s.network_bandwidth;
      d.network_latency = kNetworkLatency;
      spec.devices.push_back(std::move(d));
    }
    spec.hosts.push_back(std::move(host));
  }
  return spec;
}

void AddLink(TopologySpec& spec, int a, int b, LinkKind kind, double bandwidth,
             double latency = kNvlinkLatency) {
  spec.links.push_back(
      {.a = a, .b = b, .kind = kind, .declared_bandwidth = bandwidth, .declared_latency = latency});
}

// One host of 8 GPUs joined in NVLink pairs (0-1, 2-3, ...), PCIe between the pairs.
TopologySpec NvlinkPairHost() {
  TopologySpec spec = MakeSpec(
      {.intra = IntraHostDefault{
           .kind = LinkKind::kPcie, .bandwidth = kPcieBandwidth, .latency = kPcieLatency}});
  for (int i = 0; i < 8; i += 2) AddLink(spec, i, i + 1, LinkKind::kNvlink, kNvlinkBandwidth);
  return spec;
}

Topology BuildOk(TopologySpec spec) {
  Result<Topology> t = Topology::Build(std::move(spec));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

std::vector<int> AllDevices(const Topology& t) {
  std::vector<int> all(t.num_devices());
  for (int i = 0; i < t.num_devices(); ++i) all[i] = i;
  return all;
}

// --- Build: validation ---------------------------------------------------------------------

struct InvalidCase {
  std::string name;
  int hosts = 1;
  std::function<void(TopologySpec&)> break_spec;
  std::string culprit;  // what the message must name
};

class TopologyBuildRejects : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(TopologyBuildRejects, WithInvalidArgumentNamingTheCulprit) {
  const InvalidCase& c = GetParam();
  TopologySpec spec = MakeSpec({.hosts = c.hosts});
  c.break_spec(spec);
  Result<Topology> t = Topology::Build(std::move(spec));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr(c.culprit));
}

INSTANTIATE_TEST_SUITE_P(
    TopologyBuild, TopologyBuildRejects,
    ::testing::Values(
        InvalidCase{"EmptyDeviceId", 1, [](TopologySpec& s) { s.devices[3].id = ""; }, "device #3"},
        InvalidCase{"DuplicateDeviceId", 1,
                    [](TopologySpec& s) { s.devices[5].id = s.devices[2].id; }, "h0/gpu2"},
        InvalidCase{"DeviceOfUnknownHost", 1,
                    [](TopologySpec& s) { s.devices[1].host = "nowhere"; }, "nowhere"},
        InvalidCase{"ZeroMemory", 1, [](TopologySpec& s) { s.devices[1].memory_bytes = 0; },
                    "h0/gpu1"},
        InvalidCase{"NegativeFlops", 1, [](TopologySpec& s) { s.devices[4].peak_flops_fp32 = -1; },
                    "h0/gpu4"},
        InvalidCase{"ZeroMemoryBandwidth", 1,
                    [](TopologySpec& s) { s.devices[7].memory_bandwidth = 0; }, "h0/gpu7"},
        InvalidCase{"NanMemoryBandwidth", 1,
                    [](TopologySpec& s) { s.devices[0].memory_bandwidth = std::nan(""); },
                    "h0/gpu0"},
        InvalidCase{"ZeroNetworkBandwidthWithSeveralHosts", 2,
                    [](TopologySpec& s) { s.devices[9].network_bandwidth = 0; }, "h1/gpu1"},
        InvalidCase{"LinkToUnknownIndex", 1,
                    [](TopologySpec& s) { AddLink(s, 0, 99, LinkKind::kNvlink, 1e9); }, "99"},
        InvalidCase{"LinkBetweenHosts", 2,
                    [](TopologySpec& s) { AddLink(s, 0, 8, LinkKind::kNvlink, 1e9); }, "h1/gpu0"},
        InvalidCase{"LinkToItself", 1,
                    [](TopologySpec& s) { AddLink(s, 2, 2, LinkKind::kNvlink, 1e9); }, "h0/gpu2"},
        InvalidCase{"DuplicateLinkInEitherOrder", 1,
                    [](TopologySpec& s) {
                      AddLink(s, 0, 1, LinkKind::kNvlink, 1e9);
                      AddLink(s, 1, 0, LinkKind::kNvlink, 1e9);
                    },
                    "duplicate link"},
        InvalidCase{"ZeroLinkBandwidth", 1,
                    [](TopologySpec& s) { AddLink(s, 3, 4, LinkKind::kNvlink, 0); }, "h0/gpu4"},
        InvalidCase{"NegativeLinkLatency", 1,
                    [](TopologySpec& s) { AddLink(s, 3, 4, LinkKind::kNvlink, 1e9, -1); },
                    "h0/gpu3"},
        InvalidCase{"DuplicateHost", 2, [](TopologySpec& s) { s.hosts[1].name = "h0"; }, "h0"},
        InvalidCase{"ZeroHostDefaultBandwidth", 2,
                    [](TopologySpec& s) { s.hosts[1].intra_host_default->bandwidth = 0; }, "h1"},
        InvalidCase{"DeviceRackDiffersFromHost", 1,
                    [](TopologySpec& s) {
                      s.hosts[0].rack = "r0";
                      s.devices[6].rack = "r1";
                    },
                    "h0/gpu6"},
        InvalidCase{"CrossRackFactorAboveOne", 1,
                    [](TopologySpec& s) { s.network.cross_rack_bandwidth_factor = 1.5; },
                    "cross_rack_bandwidth_factor"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

TEST(TopologyBuildTest, IndexesDevicesByIdAndNormalisesLinkOrder) {
  TopologySpec spec = MakeSpec({.hosts = 2});
  AddLink(spec, 5, 1, LinkKind::kNvlink, kNvlinkBandwidth);
  Topology t = BuildOk(std::move(spec));
  EXPECT_EQ(t.num_devices(), 16);
  EXPECT_EQ(t.Find("h1/gpu3"), 11);
  EXPECT_EQ(t.Find("h9/gpu0"), std::nullopt);
  EXPECT_EQ(t.host_of(11), 1);
  ASSERT_EQ(t.links().size(), 1u);
  EXPECT_EQ(t.links()[0].a, 1);
  EXPECT_EQ(t.links()[0].b, 5);
}

TEST(TopologyBuildTest, SingleHostNeedsNoNetworkBandwidth) {
  EXPECT_TRUE(Topology::Build(MakeSpec({.network_bandwidth = 0})).ok());
}

TEST(TopologyBuildTest, DevicesInheritTheirHostsRack) {
  Topology t = BuildOk(MakeSpec({.hosts = 2, .racks = 2}));
  EXPECT_EQ(t.device(0).rack, "r0");
  EXPECT_EQ(t.device(8).rack, "r1");
}

// --- Path and TransferSeconds --------------------------------------------------------------

TEST(TopologyPathTest, SameDeviceIsItsMemoryBandwidth) {
  Topology t = BuildOk(MakeSpec({}));
  PathCost p = t.Path(3, 3);
  EXPECT_EQ(p.bandwidth, kMemoryBandwidth);
  EXPECT_EQ(p.latency, 0);
  EXPECT_FALSE(p.crosses_host);
}

TEST(TopologyPathTest, SameHostUsesTheExplicitLinkInEitherDirection) {
  Topology t = BuildOk(NvlinkPairHost());
  for (auto [a, b] : {std::pair{2, 3}, std::pair{3, 2}}) {
    PathCost p = t.Path(a, b);
    EXPECT_EQ(p.bandwidth, kNvlinkBandwidth);
    EXPECT_EQ(p.latency, kNvlinkLatency);
    EXPECT_EQ(p.kind, LinkKind::kNvlink);
    EXPECT_FALSE(p.crosses_host);
  }
}

TEST(TopologyPathTest, SameHostWithoutLinkUsesTheHostDefault) {
  Topology t = BuildOk(NvlinkPairHost());
  PathCost p = t.Path(1, 2);
  EXPECT_EQ(p.bandwidth, kPcieBandwidth);
  EXPECT_EQ(p.latency, kPcieLatency);
  EXPECT_EQ(p.kind, LinkKind::kPcie);
}

TEST(TopologyPathTest, SameHostWithoutDefaultIsConservative) {
  Topology t = BuildOk(MakeSpec({.intra = std::nullopt}));
  PathCost p = t.Path(0, 1);
  EXPECT_EQ(p.bandwidth, kConservativeIntraHostBandwidth);
  EXPECT_EQ(p.latency, kConservativeIntraHostLatency);
  EXPECT_EQ(p.kind, LinkKind::kPcie);

  Topology cpus = BuildOk(MakeSpec({.intra = std::nullopt, .kind = DeviceKind::kCpu}));
  EXPECT_EQ(cpus.Path(0, 1).kind, LinkKind::kSharedMemory);
}

TEST(TopologyPathTest, MeasuredValuesWinOverDeclared) {
  TopologySpec spec = NvlinkPairHost();
  spec.links[0].measured_bandwidth = 100e9;
  spec.hosts[0].intra_host_default->measured_bandwidth = 20e9;
  Topology t = BuildOk(std::move(spec));
  EXPECT_EQ(t.Path(0, 1).bandwidth, 100e9);
  EXPECT_EQ(t.Path(0, 2).bandwidth, 20e9);
}

TEST(TopologyPathTest, CrossHostTakesTheSlowerNetworkShareAndLargerLatency) {
  TopologySpec spec = MakeSpec({.hosts = 2});
  spec.devices[9].network_bandwidth = 5e9;
  spec.devices[9].network_latency = 20e-6;
  Topology t = BuildOk(std::move(spec));
  PathCost p = t.Path(1, 9);
  EXPECT_EQ(p.bandwidth, 5e9);
  EXPECT_EQ(p.latency, 20e-6);
  EXPECT_EQ(p.kind, LinkKind::kNetwork);
  EXPECT_TRUE(p.crosses_host);
  EXPECT_FALSE(p.crosses_rack);
  EXPECT_EQ(t.Path(0, 8).bandwidth, kNetworkBandwidth);
}

TEST(TopologyPathTest, CrossRackAppliesTheFactorAndAddsLatency) {
  Topology t = BuildOk(
      MakeSpec({.hosts = 4, .racks = 2, .cross_rack_factor = 0.25, .cross_rack_latency = 10e-6}));
  PathCost same_rack = t.Path(0, 8);  // h0, h1 in r0
  EXPECT_FALSE(same_rack.crosses_rack);
  EXPECT_EQ(same_rack.bandwidth, kNetworkBandwidth);
  PathCost cross = t.Path(0, 16);  // h0 in r0, h2 in r1
  EXPECT_TRUE(cross.crosses_rack);
  EXPECT_TRUE(cross.crosses_host);
  EXPECT_DOUBLE_EQ(cross.bandwidth, 0.25 * kNetworkBandwidth);
  EXPECT_DOUBLE_EQ(cross.latency, kNetworkLatency + 10e-6);
}

TEST(TopologyPathTest, UndeclaredRacksNeverCrossRacks) {
  TopologySpec spec = MakeSpec({.hosts = 2, .cross_rack_factor = 0.25});
  spec.hosts[0].rack = "r0";  // h1 declares none
  Topology t = BuildOk(std::move(spec));
  EXPECT_FALSE(t.Path(0, 8).crosses_rack);
  EXPECT_EQ(t.Path(0, 8).bandwidth, kNetworkBandwidth);
}

TEST(TopologyPathTest, TransferSecondsIsLatencyPlusBytesOverBandwidth) {
  Topology t = BuildOk(MakeSpec({.hosts = 2}));
  const int64_t bytes = int64_t{1} << 30;
  EXPECT_DOUBLE_EQ(t.TransferSeconds(0, 1, bytes),
                   kNvlinkLatency + static_cast<double>(bytes) / kNvlinkBandwidth);
  EXPECT_DOUBLE_EQ(t.TransferSeconds(0, 8, bytes),
                   kNetworkLatency + static_cast<double>(bytes) / kNetworkBandwidth);
  EXPECT_DOUBLE_EQ(t.TransferSeconds(0, 8, 0), kNetworkLatency);
}

// --- Collective ----------------------------------------------------------------------------

TEST(TopologyCollectiveTest, RingAllreduceMatchesAlphaBetaOnAUniformClique) {
  Topology t = BuildOk(MakeSpec({}));
  const double s = static_cast<double>(int64_t{1} << 30);
  const double n = 8;
  CollectiveCost c = t.Collective(CollectiveOp::kAllreduce, AllDevices(t), int64_t{1} << 30,
                                  CollectiveAlgo::kRing);
  EXPECT_EQ(c.algo, CollectiveAlgo::kRing);
  EXPECT_DOUBLE_EQ(c.seconds,
                   2 * (n - 1) / n * s / kNvlinkBandwidth + 2 * (n - 1) * kNvlinkLatency);
  EXPECT_FALSE(c.crosses_slow_link);
}

TEST(TopologyCollectiveTest, RingReduceScatterAndAllgatherAreHalfAnAllreduce) {
  Topology t = BuildOk(MakeSpec({}));
  const int64_t s = int64_t{1} << 26;
  const double ar =
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), s, CollectiveAlgo::kRing).seconds;
  for (CollectiveOp op : {CollectiveOp::kReduceScatter, CollectiveOp::kAllgather}) {
    EXPECT_DOUBLE_EQ(t.Collective(op, AllDevices(t), s, CollectiveAlgo::kRing).seconds, ar / 2);
  }
  EXPECT_DOUBLE_EQ(
      t.Collective(CollectiveOp::kBroadcast, AllDevices(t), s, CollectiveAlgo::kRing).seconds,
      7 * kNvlinkLatency + static_cast<double>(s) / kNvlinkBandwidth);
}

TEST(TopologyCollectiveTest, RingIsLimitedByItsSlowestHop) {
  // Two hosts: the ring crosses the network twice, at the network's bandwidth and latency.
  Topology t = BuildOk(MakeSpec({.hosts = 2}));
  const double s = static_cast<double>(int64_t{1} << 30);
  CollectiveCost c = t.Collective(CollectiveOp::kAllreduce, AllDevices(t), int64_t{1} << 30,
                                  CollectiveAlgo::kRing);
  EXPECT_DOUBLE_EQ(c.seconds, 2 * 15 * (kNetworkLatency + s / 16 / kNetworkBandwidth));
  EXPECT_TRUE(c.crosses_slow_link);
}

TEST(TopologyCollectiveTest, DeviceOrderAndDuplicatesDoNotChangeTheCost) {
  Topology t = BuildOk(MakeSpec({.hosts = 2}));
  std::vector<int> interleaved;
  for (int i = 0; i < 8; ++i) {
    interleaved.push_back(8 + i);
    interleaved.push_back(i);
    interleaved.push_back(i);
  }
  for (CollectiveAlgo algo :
       {CollectiveAlgo::kRing, CollectiveAlgo::kTree, CollectiveAlgo::kHierarchical}) {
    EXPECT_DOUBLE_EQ(t.Collective(CollectiveOp::kAllreduce, interleaved, 1 << 20, algo).seconds,
                     t.Collective(CollectiveOp::kAllreduce, AllDevices(t), 1 << 20, algo).seconds);
  }
}

TEST(TopologyCollectiveTest, HierarchicalBeatsRingAcrossASlowNetworkForLargeMessages) {
  Topology t = BuildOk(MakeSpec({.hosts = 4}));
  const int64_t bytes = int64_t{1} << 30;
  const double s = static_cast<double>(bytes);
  CollectiveCost ring =
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), bytes, CollectiveAlgo::kRing);
  CollectiveCost hier =
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), bytes, CollectiveAlgo::kHierarchical);
  EXPECT_LT(hier.seconds, ring.seconds / 4);
  // Reduce-scatter in each host, all-reduce of S/8 over 4 hosts, all-gather in each host.
  const double inside = 7 * (kNvlinkLatency + s / 8 / kNvlinkBandwidth);
  const double across = 2 * 3 * (kNetworkLatency + s / 8 / 4 / kNetworkBandwidth);
  EXPECT_DOUBLE_EQ(hier.seconds, inside + across + inside);
  EXPECT_TRUE(hier.crosses_slow_link);
  EXPECT_EQ(t.Collective(CollectiveOp::kAllreduce, AllDevices(t), bytes).algo,
            CollectiveAlgo::kHierarchical);
}

TEST(TopologyCollectiveTest, TreeBeatsRingForTinyMessages) {
  Topology t = BuildOk(MakeSpec({.hosts = 4}));
  CollectiveCost ring =
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), 8, CollectiveAlgo::kRing);
  CollectiveCost tree =
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), 8, CollectiveAlgo::kTree);
  EXPECT_LT(tree.seconds, ring.seconds);
  EXPECT_EQ(t.Collective(CollectiveOp::kAllreduce, AllDevices(t), 8).algo, CollectiveAlgo::kTree);
}

TEST(TopologyCollectiveTest, TreeAllreduceCostsEachRecursiveDoublingStep) {
  // 2 hosts x 2 devices: step 0 pairs inside hosts (NVLink), step 1 across (network).
  Topology t = BuildOk(MakeSpec({.hosts = 2, .devices_per_host = 2}));
  const double s = 1 << 20;
  EXPECT_DOUBLE_EQ(
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), 1 << 20, CollectiveAlgo::kTree).seconds,
      (kNvlinkLatency + s / kNvlinkBandwidth) + (kNetworkLatency + s / kNetworkBandwidth));
}

TEST(TopologyCollectiveTest, OneDeviceOrZeroBytesCostNothing) {
  Topology t = BuildOk(MakeSpec({.hosts = 2}));
  const std::vector<int> one = {3};
  for (CollectiveOp op :
       {CollectiveOp::kAllreduce, CollectiveOp::kReduceScatter, CollectiveOp::kAllgather,
        CollectiveOp::kBroadcast, CollectiveOp::kReduce}) {
    for (CollectiveAlgo algo : {CollectiveAlgo::kAuto, CollectiveAlgo::kRing, CollectiveAlgo::kTree,
                                CollectiveAlgo::kHierarchical}) {
      EXPECT_EQ(t.Collective(op, one, 1 << 30, algo).seconds, 0);
      EXPECT_EQ(t.Collective(op, AllDevices(t), 0, algo).seconds, 0);
      EXPECT_EQ(t.Collective(op, {}, 1 << 30, algo).seconds, 0);
    }
  }
}

TEST(TopologyCollectiveTest, AutoReturnsTheCheapestAlgorithm) {
  Topology t = BuildOk(MakeSpec({.hosts = 3,
                                 .devices_per_host = 5,
                                 .racks = 3,
                                 .cross_rack_factor = 0.5,
                                 .cross_rack_latency = 20e-6}));
  for (CollectiveOp op :
       {CollectiveOp::kAllreduce, CollectiveOp::kReduceScatter, CollectiveOp::kAllgather,
        CollectiveOp::kBroadcast, CollectiveOp::kReduce}) {
    for (int64_t bytes : {int64_t{4}, int64_t{1} << 16, int64_t{1} << 30}) {
      SCOPED_TRACE(std::string(CollectiveOpName(op)) + " bytes=" + std::to_string(bytes));
      double best = std::numeric_limits<double>::infinity();
      for (CollectiveAlgo algo :
           {CollectiveAlgo::kRing, CollectiveAlgo::kTree, CollectiveAlgo::kHierarchical}) {
        const double sec = t.Collective(op, AllDevices(t), bytes, algo).seconds;
        EXPECT_GT(sec, 0);
        best = std::min(best, sec);
      }
      CollectiveCost chosen = t.Collective(op, AllDevices(t), bytes);
      EXPECT_EQ(chosen.seconds, best);
      EXPECT_EQ(t.Collective(op, AllDevices(t), bytes, chosen.algo).seconds, best);
      EXPECT_NE(chosen.algo, CollectiveAlgo::kAuto);
    }
  }
}

TEST(TopologyCollectiveTest, CrossesASlowLinkOnlyWhenLeavingAGroup) {
  Topology t = BuildOk(NvlinkPairHost());
  EXPECT_FALSE(
      t.Collective(CollectiveOp::kAllreduce, std::vector<int>{0, 1}, 1 << 20).crosses_slow_link);
  EXPECT_TRUE(
      t.Collective(CollectiveOp::kAllreduce, std::vector<int>{0, 1, 2}, 1 << 20).crosses_slow_link);
}

TEST(TopologyCollectiveTest, GivenGroupsDriveTheHierarchicalEstimate) {
  Topology t = BuildOk(MakeSpec({.hosts = 4}));
  const int64_t bytes = int64_t{1} << 30;
  // Every device alone: hierarchical has one level, the ring.
  std::vector<Group> singles;
  for (int d = 0; d < t.num_devices(); ++d) singles.push_back({.devices = {d}});
  EXPECT_DOUBLE_EQ(
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), bytes, CollectiveAlgo::kHierarchical,
                   singles)
          .seconds,
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), bytes, CollectiveAlgo::kRing).seconds);
  EXPECT_DOUBLE_EQ(
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), bytes, CollectiveAlgo::kHierarchical,
                   t.groups())
          .seconds,
      t.Collective(CollectiveOp::kAllreduce, AllDevices(t), bytes, CollectiveAlgo::kHierarchical)
          .seconds);
}

// --- Groups --------------------------------------------------------------------------------

TEST(TopologyGroupsTest, NvswitchHostIsOneGroupOfEight) {
  Topology t = BuildOk(MakeSpec({}));
  ASSERT_EQ(t.groups().size(), 1u);
  const Group& g = t.groups()[0];
  EXPECT_EQ(g.name, "h0/g0");
  EXPECT_EQ(g.devices, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(g.min_bandwidth, kNvlinkBandwidth);
  EXPECT_FALSE(g.spans_hosts);
  EXPECT_FALSE(g.spans_racks);
  EXPECT_FALSE(t.has_user_groups());
}

TEST(TopologyGroupsTest, NvlinkPairHostIsFourGroupsOfTwo) {
  Topology t = BuildOk(NvlinkPairHost());
  ASSERT_EQ(t.groups().size(), 4u);
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(t.groups()[g].name, "h0/g" + std::to_string(g));
    EXPECT_EQ(t.groups()[g].devices, (std::vector<int>{2 * g, 2 * g + 1}));
    EXPECT_EQ(t.groups()[g].min_bandwidth, kNvlinkBandwidth);
  }
}

TEST(TopologyGroupsTest, CpuSlicesJoinedBySharedMemoryAreOneGroup) {
  Topology t = BuildOk(MakeSpec(
      {.devices_per_host = 4,
       .intra =
           IntraHostDefault{.kind = LinkKind::kSharedMemory, .bandwidth = 20e9, .latency = 1e-6},
       .kind = DeviceKind::kCpu}));
  ASSERT_EQ(t.groups().size(), 1u);
  EXPECT_EQ(t.groups()[0].devices.size(), 4u);
  EXPECT_EQ(t.groups()[0].min_bandwidth, 20e9);
}

TEST(TopologyGroupsTest, AChainOfFastLinksIsOneGroupWhoseMinimumIsTheSlowPair) {
  TopologySpec spec = MakeSpec(
      {.devices_per_host = 4,
       .intra = IntraHostDefault{
           .kind = LinkKind::kPcie, .bandwidth = kPcieBandwidth, .latency = kPcieLatency}});
  AddLink(spec, 0, 1, LinkKind::kNvlink, kNvlinkBandwidth);
  AddLink(spec, 1, 2, LinkKind::kNvlink, kNvlinkBandwidth);
  Topology t = BuildOk(std::move(spec));
  ASSERT_EQ(t.groups().size(), 2u);
  EXPECT_EQ(t.groups()[0].devices, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(t.groups()[0].min_bandwidth, kPcieBandwidth);
  EXPECT_EQ(t.groups()[1].devices, (std::vector<int>{3}));
  EXPECT_EQ(t.groups()[1].min_bandwidth, kMemoryBandwidth);
}

TEST(TopologyGroupsTest, EveryDeviceIsInExactlyOneGroupAndGroupsStayOnOneHost) {
  TopologySpec spec = MakeSpec({.hosts = 3, .racks = 3});
  spec.hosts[1].intra_host_default = IntraHostDefault{
      .kind = LinkKind::kPcie, .bandwidth = kPcieBandwidth, .latency = kPcieLatency};
  for (int i = 8; i < 16; i += 2) AddLink(spec, i, i + 1, LinkKind::kNvlink, kNvlinkBandwidth);
  spec.hosts[2].intra_host_default.reset();
  Topology t = BuildOk(std::move(spec));
  std::vector<int> seen(t.num_devices(), 0);
  for (size_t g = 0; g < t.groups().size(); ++g) {
    std::set<int> hosts;
    for (int d : t.groups()[g].devices) {
      ++seen[d];
      hosts.insert(t.host_of(d));
      EXPECT_EQ(t.group_of(d), static_cast<int>(g));
    }
    EXPECT_EQ(hosts.size(), 1u) << t.groups()[g].name;
    EXPECT_FALSE(t.groups()[g].spans_hosts);
    EXPECT_FALSE(t.groups()[g].spans_racks);
  }
  EXPECT_EQ(seen, std::vector<int>(t.num_devices(), 1));
  EXPECT_EQ(t.groups().size(), 1u + 4u + 1u);
}

TEST(TopologyGroupsTest, TenThousandDevicesBuildWithOneGroupPerHost) {
  Topology t = BuildOk(MakeSpec({.hosts = 1250, .racks = 10, .cross_rack_factor = 0.5}));
  EXPECT_EQ(t.num_devices(), 10'000);
  ASSERT_EQ(t.groups().size(), 1250u);
  EXPECT_EQ(t.groups()[1249].name, "h1249/g0");
  EXPECT_EQ(t.groups()[1249].devices.size(), 8u);
  CollectiveCost c = t.Collective(CollectiveOp::kAllreduce, AllDevices(t), int64_t{1} << 30);
  EXPECT_EQ(c.algo, CollectiveAlgo::kHierarchical);
  EXPECT_TRUE(c.crosses_slow_link);
}

// --- ResolveGroups -------------------------------------------------------------------------

TEST(TopologyResolveGroupsTest, DevicesNoUserGroupNamesKeepTheirSuggestedGroup) {
  Topology t = BuildOk(MakeSpec({.hosts = 2, .racks = 2, .cross_rack_factor = 0.5}));
  Result<std::vector<Group>> groups = t.ResolveGroups({{.name = "across", .devices = {9, 0}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 3u);
  const Group& across = (*groups)[0];
  EXPECT_EQ(across.devices, (std::vector<int>{0, 9}));
  EXPECT_TRUE(across.spans_hosts);
  EXPECT_TRUE(across.spans_racks);
  EXPECT_DOUBLE_EQ(across.min_bandwidth, 0.5 * kNetworkBandwidth);
  EXPECT_EQ((*groups)[1].name, "h0/g0");
  EXPECT_EQ((*groups)[1].devices, (std::vector<int>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ((*groups)[2].name, "h1/g0");
  EXPECT_EQ((*groups)[2].devices.size(), 7u);
}

TEST(TopologyResolveGroupsTest, RejectsOverlapsUnknownIndicesAndNameClashes) {
  Topology t = BuildOk(MakeSpec({.hosts = 2}));
  auto code = [&t](std::vector<Group> groups) { return t.ResolveGroups(groups).status().code(); };
  EXPECT_EQ(code({{.name = "a", .devices = {0, 1}}, {.name = "b", .devices = {1}}}),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({{.name = "a", .devices = {16}}}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({{.name = "a", .devices = {}}}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({{.name = "", .devices = {0}}}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({{.name = "a", .devices = {0}}, {.name = "a", .devices = {1}}}),
            ErrorCode::kInvalidArgument);
  // "h1/g0" is kept for h1's devices, so a user group may not take the name.
  EXPECT_EQ(code({{.name = "h1/g0", .devices = {0}}}), ErrorCode::kInvalidArgument);
  // ... unless it names all of them.
  EXPECT_EQ(code({{.name = "h1/g0", .devices = {8, 9, 10, 11, 12, 13, 14, 15}}}), ErrorCode::kOk);
}

// --- The admin seam ------------------------------------------------------------------------

// A view offers no way to change what it describes.
template <typename T>
concept CanAssign = requires(T& t, const T& other) {
  t = other;
};
template <typename T>
concept CanEditLinks = requires(T& t) {
  t.links()[0].measured_bandwidth = 1.0;
};
template <typename T>
concept CanEditDevices = requires(T& t) {
  t.device(0).memory_bandwidth = 1.0;
};
template <typename T>
concept CanEditSpec = requires(T& t) {
  t.spec().devices.clear();
};
template <typename T>
concept CanEditHosts = requires(T& t) {
  t.hosts()[0].intra_host_default.reset();
};
template <typename T>
concept CanEditGroups = requires(T& t) {
  t.groups()[0].devices.push_back(1);
};
static_assert(!CanAssign<Topology>);
static_assert(!CanEditLinks<Topology>);
static_assert(!CanEditDevices<Topology>);
static_assert(!CanEditSpec<Topology>);
static_assert(!CanEditHosts<Topology>);
static_assert(!CanEditGroups<Topology>);
static_assert(!std::is_default_constructible_v<Topology>);
// Only GrantForLocalAdmin mints a capability.
static_assert(!std::is_default_constructible_v<AdminCapability>);
static_assert(!std::is_constructible_v<TopologyAdmin, TopologySpec>);

TEST(AdminTopologyTest, MeasuredValuesChangeOnlyThroughACommitAndOldViewsStay) {
  Result<Topology> built = Topology::Build(NvlinkPairHost());
  ASSERT_TRUE(built.ok());
  std::shared_ptr<const Topology> job_view = std::make_shared<const Topology>(*built);

  TopologyAdmin admin(AdminCapability::GrantForLocalAdmin(), *job_view);
  ASSERT_TRUE(admin.SetLinkMeasurement("h0/gpu1", "h0/gpu0", 90e9, 3e-6).ok());
  ASSERT_TRUE(admin.SetHostDefaultMeasurement("h0", 10e9, 8e-6).ok());
  Result<std::shared_ptr<const Topology>> committed = admin.Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();

  const Topology& next = **committed;
  EXPECT_EQ(next.Path(0, 1).bandwidth, 90e9);
  EXPECT_EQ(next.Path(0, 1).latency, 3e-6);
  EXPECT_EQ(next.Path(1, 2).bandwidth, 10e9);
  EXPECT_EQ(next.links()[0].declared_bandwidth, kNvlinkBandwidth);
  // The job's view is unchanged (copy-on-write).
  EXPECT_EQ(job_view->Path(0, 1).bandwidth, kNvlinkBandwidth);
  EXPECT_FALSE(job_view->links()[0].measured_bandwidth.has_value());
  EXPECT_EQ(job_view->Path(1, 2).bandwidth, kPcieBandwidth);
}

TEST(AdminTopologyTest, CommittedUserGroupsAreWhatGroupsReturns) {
  TopologyAdmin admin(AdminCapability::GrantForLocalAdmin(), NvlinkPairHost());
  admin.SetGroups({{.name = "quad", .devices = {3, 2, 1, 0}}});
  Result<std::shared_ptr<const Topology>> t = admin.Commit();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->has_user_groups());
  ASSERT_EQ((*t)->groups().size(), 3u);
  EXPECT_EQ((*t)->groups()[0].name, "quad");
  EXPECT_EQ((*t)->groups()[0].devices, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ((*t)->groups()[0].min_bandwidth, kPcieBandwidth);
  EXPECT_EQ((*t)->groups()[1].name, "h0/g2");
  EXPECT_EQ((*t)->group_of(1), 0);
  EXPECT_EQ((*t)->group_of(5), 1);
  EXPECT_EQ((*t)->suggested_groups().size(), 4u);

  // An admin edit that starts from the committed topology keeps its groups.
  TopologyAdmin again(AdminCapability::GrantForLocalAdmin(), **t);
  Result<std::shared_ptr<const Topology>> t2 = again.Commit();
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ((*t2)->groups()[0].name, "quad");

  again.ClearGroups();
  Result<std::shared_ptr<const Topology>> t3 = again.Commit();
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_FALSE((*t3)->has_user_groups());
  EXPECT_EQ((*t3)->groups().size(), 4u);
}

TEST(AdminTopologyTest, RejectsUnknownSubjectsAndBadValues) {
  TopologyAdmin admin(AdminCapability::GrantForLocalAdmin(), NvlinkPairHost());
  EXPECT_EQ(admin.SetLinkMeasurement("h0/gpu0", "h9/gpu0", 1e9, 0).code(), ErrorCode::kNotFound);
  EXPECT_EQ(admin.SetLinkMeasurement("h0/gpu0", "h0/gpu2", 1e9, 0).code(), ErrorCode::kNotFound);
  EXPECT_EQ(admin.SetLinkMeasurement("h0/gpu0", "h0/gpu1", 0, 0).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(admin.SetLinkMeasurement("h0/gpu0", "h0/gpu1", 1e9, -1).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(admin.SetHostDefaultMeasurement("h9", 1e9, 0).code(), ErrorCode::kNotFound);
  EXPECT_EQ(admin.SetHostDefaultMeasurement("h0", std::nan(""), 0).code(),
            ErrorCode::kInvalidArgument);
  admin.SetGroups({{.name = "bad", .devices = {0, 42}}});
  EXPECT_EQ(admin.Commit().status().code(), ErrorCode::kInvalidArgument);
}

TEST(AdminTopologyTest, HostDefaultMeasurementOnAnUndeclaredHostStartsFromTheConservativeOne) {
  TopologyAdmin admin(AdminCapability::GrantForLocalAdmin(), MakeSpec({.intra = std::nullopt}));
  ASSERT_TRUE(admin.SetHostDefaultMeasurement("h0", 50e9, 1e-6).ok());
  const auto& d = admin.spec().hosts[0].intra_host_default;
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->bandwidth, kConservativeIntraHostBandwidth);
  EXPECT_EQ(d->effective_bandwidth(), 50e9);
  admin.ClearMeasurements();
  EXPECT_FALSE(admin.spec().hosts[0].intra_host_default->measured_bandwidth.has_value());
}

}  // namespace
}  // namespace kc::hal
