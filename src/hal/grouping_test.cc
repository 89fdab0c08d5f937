#include "hal/grouping.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hal/inventory.h"

namespace kc::hal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Two hosts of four GPUs: a0/gpu0..3 are devices 0-3, a1/gpu0..3 devices 4-7.
TopologySpec TwoHosts() {
  Result<TopologySpec> spec = LoadInventoryString(
      "name: two\n"
      "models:\n"
      "  X: {memory_gb: 16, peak_tflops_fp32: 10, peak_tflops_bf16: 20, "
      "memory_bandwidth_gbs: 900}\n"
      "hosts:\n"
      "  - name: \"a[0-1]\"\n"
      "    model: X\n"
      "    count: 4\n"
      "    intra_host: {kind: pcie, bandwidth_gbs: 32, latency_us: 5}\n"
      "    network: {bandwidth_gbs: 25, latency_us: 5}\n"
      "    links:\n"
      "      - {between: [0, 1], kind: nvlink, bandwidth_gbs: 300, latency_us: 2}\n",
      "two.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : TopologySpec{};
}

Result<std::vector<Group>> Load(std::string_view text) {
  return LoadGroupingString(text, "groups.yaml", TwoHosts());
}

std::string LoadError(std::string_view text) {
  Result<std::vector<Group>> groups = Load(text);
  EXPECT_FALSE(groups.ok());
  if (groups.ok()) return "";
  EXPECT_EQ(groups.status().code(), ErrorCode::kInvalidArgument) << groups.status();
  return groups.status().message();
}

TEST(GroupingTest, LoadsGroupsInFileOrderWithAscendingDevices) {
  Result<std::vector<Group>> groups = Load(
      "cluster: two\n"
      "groups:\n"
      "  - name: pair\n"
      "    devices: [a0/gpu1, a0/gpu0]\n"
      "  - name: rest\n"
      "    devices: [\"a1/gpu[0-3]\", a0/gpu3, \"a0/gpu[2]\"]\n");
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_EQ((*groups)[0].name, "pair");
  EXPECT_THAT((*groups)[0].devices, ElementsAre(0, 1));
  EXPECT_EQ((*groups)[1].name, "rest");
  EXPECT_THAT((*groups)[1].devices, ElementsAre(2, 3, 4, 5, 6, 7));
  EXPECT_EQ((*groups)[1].min_bandwidth, 0);
  EXPECT_FALSE((*groups)[1].spans_hosts);
}

TEST(GroupingTest, HostlistPatternsSpanHosts) {
  Result<std::vector<Group>> groups = Load(
      "groups:\n"
      "  - name: all\n"
      "    devices: [\"a[0-1]/gpu[0-3]\"]\n");
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_THAT((*groups)[0].devices, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

TEST(GroupingTest, UnknownDeviceIsRejected) {
  EXPECT_EQ(LoadError("groups:\n"
                      "  - name: g\n"
                      "    devices: [\"a0/gpu[0-4]\", \"a1/gpu[0-3]\"]\n"),
            "groups.yaml:3: groups[0].devices: unknown device \"a0/gpu4\"");
  EXPECT_EQ(LoadError("groups:\n"
                      "  - name: g\n"
                      "    devices: [\"a0/gpu[0-3\"]\n"),
            "groups.yaml:3: groups[0].devices: devices[0]: invalid pattern \"a0/gpu[0-3\" "
            "(unclosed \"[\")");
}

TEST(GroupingTest, DeviceNamedTwiceInOneGroupIsRejected) {
  EXPECT_EQ(LoadError("groups:\n"
                      "  - name: g\n"
                      "    devices: [\"a[0-1]/gpu[0-3]\", a1/gpu2]\n"),
            "groups.yaml:3: groups[0].devices: device \"a1/gpu2\" is named twice in this group");
}

TEST(GroupingTest, DeviceInTwoGroupsIsRejectedNamingTheFirstGroup) {
  EXPECT_EQ(LoadError("groups:\n"
                      "  - name: first\n"
                      "    devices: [\"a0/gpu[0-3]\"]\n"
                      "  - name: second\n"
                      "    devices:\n"
                      "      - \"a1/gpu[0-3]\"\n"
                      "      - a0/gpu2\n"),
            "groups.yaml:5: groups[1].devices: device \"a0/gpu2\" is already in group \"first\" "
            "(groups[0])");
}

TEST(GroupingTest, EmptyGroupIsRejected) {
  EXPECT_EQ(LoadError("groups:\n"
                      "  - name: g\n"
                      "    devices: []\n"
                      "  - name: h\n"
                      "    devices: [\"a[0-1]/gpu[0-3]\"]\n"),
            "groups.yaml:3: groups[0].devices: expected at least one device; a group cannot be "
            "empty");
}

TEST(GroupingTest, DuplicateGroupNameIsRejected) {
  EXPECT_EQ(LoadError("groups:\n"
                      "  - name: g\n"
                      "    devices: [\"a0/gpu[0-3]\"]\n"
                      "  - name: g\n"
                      "    devices: [\"a1/gpu[0-3]\"]\n"),
            "groups.yaml:4: groups[1].name: duplicate group name (first at groups[0]), got \"g\"");
}

TEST(GroupingTest, GroupsMayLeaveDevicesOut) {
  Result<std::vector<Group>> groups = Load(
      "groups:\n"
      "  - name: g\n"
      "    devices: [a1/gpu1, a0/gpu2]\n");
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_THAT((*groups)[0].devices, ElementsAre(2, 5));
  groups = Load("groups: []\n");
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_TRUE(groups->empty());
  EXPECT_EQ(LoadError("cluster: two\n"), "groups.yaml:1: groups: required key is missing");
}

TEST(GroupingTest, FileForAnotherClusterIsRejected) {
  EXPECT_EQ(LoadError("cluster: three\n"
                      "groups:\n"
                      "  - name: g\n"
                      "    devices: [\"a[0-1]/gpu[0-3]\"]\n"),
            "groups.yaml:1: cluster: this file is for another cluster; the topology is \"two\", "
            "got \"three\"");
}

TEST(GroupingTest, UnknownKeyIsRejected) {
  EXPECT_THAT(LoadError("groups:\n"
                        "  - name: g\n"
                        "    device: [\"a[0-1]/gpu[0-3]\"]\n"),
              StartsWith("groups.yaml:2: groups[0].devices: required key is missing"));
  EXPECT_THAT(LoadError("groups:\n"
                        "  - name: g\n"
                        "    devices: [\"a[0-1]/gpu[0-3]\"]\n"
                        "    bandwidth: 3\n"),
              StartsWith("groups.yaml:4: groups[0].bandwidth: unknown key"));
}

TEST(GroupingTest, MissingFileIsNotFound) {
  Result<std::vector<Group>> groups = LoadGrouping("/nonexistent/groups.yaml", TwoHosts());
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), ErrorCode::kNotFound);
}

TEST(GroupingTest, WrittenGroupsLoadBackWithRunsShortened) {
  TopologySpec spec = TwoHosts();
  std::vector<Group> groups = {
      {.name = "a0/g0", .devices = {0, 1}},
      {.name = "odd one", .devices = {2, 4, 5, 6, 7}},
      {.name = "a0/g2", .devices = {3}},
  };
  std::string yaml = GroupingToYaml(groups, spec);
  EXPECT_THAT(yaml, HasSubstr("cluster: two\n"));
  EXPECT_THAT(yaml, HasSubstr("devices: [\"a0/gpu[0-1]\"]"));
  EXPECT_THAT(yaml, HasSubstr("name: \"odd one\"\n    devices: [a0/gpu2, \"a1/gpu[0-3]\"]"));
  Result<std::vector<Group>> again = LoadGroupingString(yaml, "written.yaml", spec);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  ASSERT_EQ(again->size(), groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    EXPECT_EQ((*again)[i].name, groups[i].name);
    EXPECT_EQ((*again)[i].devices, groups[i].devices);
  }
}

TEST(GroupingTest, PerHostGroupsOfTenThousandDevicesRoundTrip) {
  Result<TopologySpec> spec = LoadInventoryString(
      "name: big\n"
      "models:\n"
      "  X: {memory_gb: 16, peak_tflops_fp32: 10, peak_tflops_bf16: 20, "
      "memory_bandwidth_gbs: 900}\n"
      "hosts:\n"
      "  - name: \"node[0000-1249]\"\n"
      "    model: X\n"
      "    count: 8\n"
      "    network: {bandwidth_gbs: 25, latency_us: 5}\n",
      "big.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<Group> groups;
  for (int h = 0; h < 1250; ++h) {
    Group& g = groups.emplace_back();
    g.name = spec->hosts[static_cast<size_t>(h)].name + "/g0";
    for (int i = 0; i < 8; ++i) g.devices.push_back(h * 8 + i);
  }
  std::string yaml = GroupingToYaml(groups, *spec);
  EXPECT_THAT(yaml, HasSubstr("  - name: node0007/g0\n    devices: [\"node0007/gpu[0-7]\"]\n"));
  Result<std::vector<Group>> again = LoadGroupingString(yaml, "written.yaml", *spec);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->size(), 1250u);
  EXPECT_EQ(again->back().devices, groups.back().devices);
}

}  // namespace
}  // namespace kc::hal
