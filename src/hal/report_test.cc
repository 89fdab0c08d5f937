#include "hal/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kc::hal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kNvlinkBandwidth = 300e9;
constexpr double kPcieBandwidth = 32e9;
constexpr double kNetworkBandwidth = 12.5e9;

// `hosts` x `per_host` simulated GPUs; host h is "h<h>" in rack "r<h * racks / hosts>" (no
// rack when racks = 0), devices "h<h>/gpu<i>". NVSwitch inside hosts unless `nvlink_pairs`:
// then PCIe between GPUs and NVLink in pairs 0-1, 2-3, ...
TopologySpec MakeSpec(int hosts, int per_host, int racks = 0, bool nvlink_pairs = false) {
  TopologySpec spec;
  spec.name = "report-test";
  spec.network.cross_rack_bandwidth_factor = 0.5;
  for (int h = 0; h < hosts; ++h) {
    HostSpec host{.name = "h" + std::to_string(h)};
    if (racks > 0) host.rack = "r" + std::to_string(h * racks / hosts);
    host.intra_host_default = nvlink_pairs ? IntraHostDefault{.kind = LinkKind::kPcie,
                                                              .bandwidth = kPcieBandwidth,
                                                              .latency = 5e-6}
                                           : IntraHostDefault{.kind = LinkKind::kNvlink,
                                                              .bandwidth = kNvlinkBandwidth,
                                                              .latency = 2e-6};
    for (int i = 0; i < per_host; ++i) {
      DeviceDescriptor d;
      d.id = host.name + "/gpu" + std::to_string(i);
      d.kind = DeviceKind::kSimulated;
      d.host = host.name;
      d.index_on_host = i;
      d.memory_bytes = int64_t{80} << 30;
      d.peak_flops_fp32 = 60e12;
      d.memory_bandwidth = 3e12;
      d.network_bandwidth = kNetworkBandwidth;
      d.network_latency = 5e-6;
      const int index = static_cast<int>(spec.devices.size());
      spec.devices.push_back(std::move(d));
      if (nvlink_pairs && i % 2 == 1) {
        spec.links.push_back({.a = index - 1,
                              .b = index,
                              .kind = LinkKind::kNvlink,
                              .declared_bandwidth = kNvlinkBandwidth,
                              .declared_latency = 2e-6});
      }
    }
    spec.hosts.push_back(std::move(host));
  }
  return spec;
}

Topology BuildOk(TopologySpec spec) {
  Result<Topology> t = Topology::Build(std::move(spec));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

std::vector<const Anomaly*> AnomaliesOf(const TopologyReport& r, AnomalyKind kind) {
  std::vector<const Anomaly*> out;
  for (const Anomaly& a : r.anomalies) {
    if (a.kind == kind) out.push_back(&a);
  }
  return out;
}

TEST(ReportTest, CleanTopologyHasNoAnomalies) {
  Topology t = BuildOk(MakeSpec(4, 8, 2));
  ProbeFindings probe{.host = "h0"};
  for (int i = 0; i < 8; ++i) probe.device_ids.push_back("h0/gpu" + std::to_string(i));
  TopologyReport r = MakeReport(t, {.probe = probe});
  EXPECT_TRUE(r.anomalies.empty()) << RenderReportText(r);
  EXPECT_EQ(r.num_devices, 32);
  EXPECT_EQ(r.num_hosts, 4);
  EXPECT_EQ(r.num_racks, 2);
  EXPECT_EQ(r.groups.size(), 4u);
  EXPECT_THAT(RenderReportText(r), HasSubstr("Anomalies\n  none\n"));
}

TEST(ReportTest, AdvisesTensorParallelInsideGroupsAndHierarchicalAcrossTheNetwork) {
  Topology t = BuildOk(MakeSpec(4, 8));
  TopologyReport r = MakeReport(t);
  ASSERT_EQ(r.paths.size(), 5u);
  EXPECT_EQ(r.paths[0].parallelism, "tensor");
  EXPECT_EQ(r.paths[0].scope, "h0/g0");
  EXPECT_EQ(r.paths[0].max_devices, 8);
  EXPECT_EQ(r.paths[0].bandwidth, kNvlinkBandwidth);
  EXPECT_EQ(r.paths[0].kind, LinkKind::kNvlink);
  EXPECT_THAT(r.paths[0].message, HasSubstr("up to 8 devices inside h0/g0 at 300.0 GB/s"));
  EXPECT_EQ(r.paths[4].parallelism, "data");
  EXPECT_EQ(r.paths[4].kind, LinkKind::kNetwork);
  EXPECT_EQ(r.inter_group_bandwidth, kNetworkBandwidth);
  ASSERT_TRUE(r.allreduce.has_value());
  EXPECT_TRUE(r.allreduce->recommend_hierarchical);
  EXPECT_EQ(r.allreduce->bytes, int64_t{1} << 30);
  EXPECT_LT(r.allreduce->hierarchical_seconds, r.allreduce->ring_seconds);
  EXPECT_EQ(r.allreduce->best, CollectiveAlgo::kHierarchical);
  EXPECT_THAT(r.paths[4].message, HasSubstr("hierarchical all-reduce"));
}

TEST(ReportTest, PlantedCrossRackUserGroupIsFlagged) {
  Topology t = BuildOk(MakeSpec(4, 8, 2));
  ReportOptions options;
  options.user_groups = std::vector<Group>{{.name = "planted", .devices = {0, 16}}};
  TopologyReport r = MakeReport(t, options);
  EXPECT_TRUE(r.user_groups);
  std::vector<const Anomaly*> racks = AnomaliesOf(r, AnomalyKind::kGroupSpansRacks);
  ASSERT_EQ(racks.size(), 1u);
  EXPECT_EQ(racks[0]->subject, "planted");
  EXPECT_THAT(racks[0]->message, HasSubstr("r0, r1"));
  std::vector<const Anomaly*> slow = AnomaliesOf(r, AnomalyKind::kGroupSpansSlowLink);
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0]->subject, "planted");
  EXPECT_EQ(r.groups[0].min_bandwidth, 0.5 * kNetworkBandwidth);
}

TEST(ReportTest, PlantedSlowLinkIsFlagged) {
  TopologySpec spec = MakeSpec(1, 8, 0, /*nvlink_pairs=*/true);
  spec.links[1].measured_bandwidth = 0.3 * kNvlinkBandwidth;  // h0/gpu2 <-> h0/gpu3
  spec.links[2].measured_bandwidth = 0.6 * kNvlinkBandwidth;  // slower, but not by half
  Topology t = BuildOk(std::move(spec));
  TopologyReport r = MakeReport(t);
  std::vector<const Anomaly*> slow = AnomaliesOf(r, AnomalyKind::kSlowLink);
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0]->subject, "h0/gpu2 <-> h0/gpu3");
  EXPECT_THAT(slow[0]->message, HasSubstr("0.30x"));
}

TEST(ReportTest, SlowMeasuredHostDefaultIsFlagged) {
  TopologySpec spec = MakeSpec(2, 8);
  spec.hosts[1].intra_host_default->measured_bandwidth = 0.1 * kNvlinkBandwidth;
  TopologyReport r = MakeReport(BuildOk(std::move(spec)));
  std::vector<const Anomaly*> slow = AnomaliesOf(r, AnomalyKind::kSlowLink);
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0]->subject, "h1");
}

TEST(ReportTest, DeclaredButNotFoundDeviceIsFlagged) {
  Topology t = BuildOk(MakeSpec(2, 8));
  ProbeFindings probe{.host = "h1"};
  for (int i = 0; i < 8; ++i) {
    if (i != 5) probe.device_ids.push_back("h1/gpu" + std::to_string(i));
  }
  probe.device_ids.push_back("h1/gpu8");
  TopologyReport r = MakeReport(t, {.probe = probe});
  std::vector<const Anomaly*> missing = AnomaliesOf(r, AnomalyKind::kDeviceNotFound);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0]->subject, "h1/gpu5");
  std::vector<const Anomaly*> extra = AnomaliesOf(r, AnomalyKind::kDeviceNotDeclared);
  ASSERT_EQ(extra.size(), 1u);
  EXPECT_EQ(extra[0]->subject, "h1/gpu8");
}

TEST(ReportTest, UserGroupSpanningAPciePairOnAMixedHostIsFlagged) {
  Topology t = BuildOk(MakeSpec(1, 8, 0, /*nvlink_pairs=*/true));
  EXPECT_TRUE(MakeReport(t).anomalies.empty());  // the suggested pairs are clean
  ReportOptions options;
  options.user_groups = std::vector<Group>{{.name = "triple", .devices = {0, 1, 2}}};
  TopologyReport r = MakeReport(t, options);
  std::vector<const Anomaly*> slow = AnomaliesOf(r, AnomalyKind::kGroupSpansSlowLink);
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0]->subject, "triple");
  EXPECT_THAT(slow[0]->message, HasSubstr("pcie"));
  EXPECT_TRUE(AnomaliesOf(r, AnomalyKind::kGroupSpansRacks).empty());
}

TEST(ReportTest, RejectedUserGroupingFallsBackToTheTopologysGroups) {
  Topology t = BuildOk(MakeSpec(2, 8));
  ReportOptions options;
  options.user_groups =
      std::vector<Group>{{.name = "a", .devices = {0, 1}}, {.name = "b", .devices = {1, 2}}};
  TopologyReport r = MakeReport(t, options);
  EXPECT_FALSE(r.user_groups);
  EXPECT_EQ(r.groups.size(), 2u);
  ASSERT_EQ(AnomaliesOf(r, AnomalyKind::kInvalidGrouping).size(), 1u);
}

TEST(ReportTest, TextCollapsesHostsWithTheSameLayout) {
  Topology t = BuildOk(MakeSpec(1250, 8, 10));
  const std::string text = RenderReportText(MakeReport(t));
  EXPECT_THAT(text, HasSubstr("10,000 devices on 1,250 hosts in 10 racks"));
  EXPECT_THAT(text, HasSubstr("h0/g0"));
  EXPECT_THAT(text, HasSubstr("h1/g0"));
  EXPECT_THAT(text, Not(HasSubstr("h2/g0")));
  EXPECT_THAT(text, HasSubstr("… and 1,248 more hosts with the same layout as h0"));
  EXPECT_THAT(text, HasSubstr("Same for 1,249 more groups."));
  EXPECT_LT(std::count(text.begin(), text.end(), '\n'), 40);
}

TEST(ReportTest, TextMarksAnomaliesWithWarning) {
  TopologySpec spec = MakeSpec(1, 8, 0, /*nvlink_pairs=*/true);
  spec.links[0].measured_bandwidth = 0.3 * kNvlinkBandwidth;
  const std::string text = RenderReportText(MakeReport(BuildOk(std::move(spec))));
  EXPECT_THAT(text, HasSubstr("WARNING slow_link h0/gpu0 <-> h0/gpu1:"));
}

TEST(ReportTest, JsonParsesAndHasTheFields) {
  TopologySpec spec = MakeSpec(2, 8, 2, /*nvlink_pairs=*/true);
  spec.links[0].measured_bandwidth = 0.3 * kNvlinkBandwidth;
  Topology t = BuildOk(std::move(spec));
  const nlohmann::json doc = nlohmann::json::parse(RenderReportJson(MakeReport(t)));
  EXPECT_EQ(doc["name"], "report-test");
  EXPECT_EQ(doc["num_devices"], 16);
  EXPECT_EQ(doc["num_hosts"], 2);
  EXPECT_EQ(doc["num_racks"], 2);
  EXPECT_EQ(doc["user_groups"], false);
  // The slow NVLink no longer joins h0/gpu0 and h0/gpu1: h0 has 5 groups, h1 has 4.
  ASSERT_EQ(doc["groups"].size(), 9u);
  const nlohmann::json& g = doc["groups"][2];
  EXPECT_EQ(g["name"], "h0/g2");
  EXPECT_EQ(g["size"], 2);
  EXPECT_EQ(g["devices"], nlohmann::json({"h0/gpu2", "h0/gpu3"}));
  EXPECT_EQ(g["min_bandwidth"], kNvlinkBandwidth);
  EXPECT_EQ(g["spans_hosts"], false);
  EXPECT_EQ(g["spans_racks"], false);
  EXPECT_EQ(doc["groups"][0]["devices"], nlohmann::json({"h0/gpu0"}));
  ASSERT_EQ(doc["paths"].size(), 8u);
  for (const char* key :
       {"parallelism", "scope", "max_devices", "bandwidth", "link_kind", "message"}) {
    EXPECT_TRUE(doc["paths"][0].contains(key)) << key;
  }
  EXPECT_EQ(doc["paths"][7]["parallelism"], "data");
  EXPECT_EQ(doc["inter_group_bandwidth"], 0.5 * kNetworkBandwidth);
  for (const char* key : {"bytes", "ring_seconds", "tree_seconds", "hierarchical_seconds", "best",
                          "recommend_hierarchical"}) {
    EXPECT_TRUE(doc["allreduce"].contains(key)) << key;
  }
  ASSERT_EQ(doc["anomalies"].size(), 1u);
  EXPECT_EQ(doc["anomalies"][0]["kind"], "slow_link");
  EXPECT_EQ(doc["anomalies"][0]["subject"], "h0/gpu0 <-> h0/gpu1");
  EXPECT_TRUE(doc["anomalies"][0]["message"].is_string());
}

TEST(ReportTest, SingleDeviceHasNoEstimateAndNoAdvice) {
  Topology t = BuildOk(MakeSpec(1, 1));
  TopologyReport r = MakeReport(t);
  EXPECT_FALSE(r.allreduce.has_value());
  EXPECT_TRUE(r.paths.empty());
  const nlohmann::json doc = nlohmann::json::parse(RenderReportJson(r));
  EXPECT_TRUE(doc["allreduce"].is_null());
}

}  // namespace
}  // namespace kc::hal
