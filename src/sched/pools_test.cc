#include "sched/pools.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hal/inventory.h"

namespace kc::sched {
namespace {

using ::testing::HasSubstr;

TEST(PoolsTest, ReadsPoolsAndSettings) {
  Result<PoolConfig> c = LoadPoolConfigString(R"(
pools:
  - {name: high, classes: [high], share: 0.25}
  - {name: vision, classes: [normal], teams: [vision], hosts: "b0", lend: false}
  - {name: normal, classes: [normal, preemptible], rest: true}
scheduler:
  preempt_grace_s: 10
  fair_share_half_life_h: 24
  starve_after_h: 6
  high_max_wait_s: 600
)",
                                              "pools.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->pools.size(), 3u);
  EXPECT_EQ(c->pools[0].share, 0.25);
  EXPECT_EQ(c->pools[1].teams, std::vector<std::string>{"vision"});
  EXPECT_FALSE(c->pools[1].lend);
  EXPECT_TRUE(c->pools[2].rest);
  EXPECT_EQ(c->pools[2].classes.size(), 2u);
  EXPECT_EQ(c->settings.preempt_grace_s, 10);
  EXPECT_EQ(c->settings.fair_share_half_life_s, 86400);
  EXPECT_EQ(c->settings.starve_after_s, 6 * 3600);
  EXPECT_EQ(c->settings.high_max_wait_s, 600);
  EXPECT_EQ(PoolConfig{}.settings.starve_after_s, 4 * 3600);
  EXPECT_EQ(PoolConfig{}.settings.high_max_wait_s, 1800);
}

TEST(PoolsTest, ErrorsNameTheFileLineAndKey) {
  auto error = [](std::string text) {
    return LoadPoolConfigString(text, "p.yaml").status().message();
  };
  EXPECT_THAT(error("pools:\n  - {name: a, classes: [urgent], rest: true}\n"),
              HasSubstr("p.yaml:2: pools[0].classes: expected classes among high, normal"));
  EXPECT_THAT(error("pools:\n  - {name: a, classes: [high], devices: 4, rest: true}\n"),
              HasSubstr("expected exactly one of devices, share, hosts, rest: true"));
  EXPECT_THAT(error("pools:\n  - {name: a, classes: [high], rest: true}\n"
                    "  - {name: a, classes: [normal], devices: 2}\n"),
              HasSubstr("p.yaml:3: pools[1].name: used by an earlier pool"));
  EXPECT_THAT(error("pools:\n  - {name: a, classes: [high], rest: true, colour: red}\n"),
              HasSubstr("colour"));
  EXPECT_THAT(error("pools:\n  - {name: a, classes: [high], rest: true}\n"
                    "scheduler: {preempt_grace_s: -1}\n"),
              HasSubstr("scheduler.preempt_grace_s"));
  for (const char* key : {"starve_after_h", "high_max_wait_s"}) {
    EXPECT_THAT(error(fmt::format("pools:\n  - {{name: a, classes: [high], rest: true}}\n"
                                  "scheduler: {{{}: -1}}\n",
                                  key)),
                HasSubstr(std::string("scheduler.") + key));
  }
  EXPECT_THAT(error("pools: []\n"), HasSubstr("expected at least one pool"));
  EXPECT_EQ(LoadPoolConfig("/nonexistent/pools.yaml").status().code(), ErrorCode::kNotFound);
}

hal::Topology Cluster() {
  Result<hal::TopologySpec> spec = hal::LoadInventoryString(R"(
name: c8
models:
  M: {kind: simulated, memory_gb: 80, peak_tflops_fp32: 10, peak_tflops_bf16: 0,
      memory_bandwidth_gbs: 1000}
hosts:
  - {name: "b[0-1]", rack: r1, model: M, count: 2,
     network: {bandwidth_gbs: 25, latency_us: 5}}
  - {name: "a[0-1]", rack: r0, model: M, count: 2,
     network: {bandwidth_gbs: 25, latency_us: 5}}
)",
                                                            "c8.yaml");
  KC_CHECK(spec.ok()) << spec.status().message();
  Result<hal::Topology> t = hal::Topology::Build(std::move(*spec));
  KC_CHECK(t.ok()) << t.status().message();
  return std::move(*t);
}

TEST(PoolsTest, PartitionTakesHostlistsFirstThenWholeHostsRackByRack) {
  hal::Topology topo = Cluster();  // devices 0-3 on b0, b1 (rack r1); 4-7 on a0, a1 (r0)
  PoolConfig c;
  c.pools.push_back({.name = "x", .classes = {JobClass::kHigh}, .devices = 2});
  c.pools.push_back({.name = "y", .classes = {JobClass::kNormal}, .hosts = "b0"});
  c.pools.push_back({.name = "z", .classes = {JobClass::kNormal}, .rest = true});
  Result<std::vector<Pool>> p = PartitionPools(topo, c);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ((*p)[1].devices, (std::vector<int>{0, 1}));  // b0
  EXPECT_EQ((*p)[0].devices, (std::vector<int>{2, 3}));  // next host in rack r1: b1
  EXPECT_EQ((*p)[2].devices, (std::vector<int>{4, 5, 6, 7}));

  c.pools[0].devices = 9;
  EXPECT_THAT(PartitionPools(topo, c).status().message(),
              HasSubstr("pool \"x\": asks for 9 devices, but only 6 of the 8"));
  c.pools[0].devices = 2;
  c.pools[1].hosts = "c0";
  EXPECT_THAT(PartitionPools(topo, c).status().message(),
              HasSubstr("pool \"y\": host \"c0\" is not in cluster \"c8\""));
  c.pools[1].hosts = "b0";
  c.pools[2].rest = false;
  c.pools[2].devices = 1;
  EXPECT_THAT(PartitionPools(topo, c).status().message(),
              HasSubstr("3 devices of cluster \"c8\" (the first a0/gpu1) are in no pool"));
}

TEST(PoolsTest, DefaultPoolsCoverTheCluster) {
  hal::Topology topo = Cluster();
  Result<std::vector<Pool>> p = PartitionPools(topo, DefaultPoolConfig());
  ASSERT_TRUE(p.ok()) << p.status().message();
  size_t total = 0;
  for (const Pool& pool : *p) total += pool.devices.size();
  EXPECT_EQ(total, 8u);
  EXPECT_EQ((*p)[0].spec.name, "high");
  EXPECT_EQ((*p)[0].devices.size(), 1u);
}

}  // namespace
}  // namespace kc::sched
