#include "parallel/planner/hetero.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "hal/inventory.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/planner/cluster.h"
#include "tests/support/repo_root.h"

namespace kc::parallel::planner {
namespace {

hal::Topology Example(const std::string& name) {
  Result<hal::TopologySpec> spec =
      hal::LoadInventory(kc::testing::RepoRoot() + "examples/clusters/" + name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  Result<hal::Topology> t = hal::Topology::Build(*spec);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// GPT-2 small's shape with a 24-layer stack: enough layers to size stages by.
ModelSpec Model() {
  ModelSpec s;
  s.name = "m";
  s.layers = 24;
  s.hidden = 1024;
  s.heads = 16;
  s.ffn_hidden = 4096;
  s.vocab = 32000;
  s.seq_len = 1024;
  s.batch_per_rank = 1;
  return s;
}

ParallelPlan Plan(int t, int p, int d, int64_t m) {
  ParallelPlan plan;
  plan.t = t;
  plan.p = p;
  plan.d = d;
  plan.micro_batch_size = 1;
  plan.micro_batches = m;
  return plan;
}

int Sum(const DeviceEstimate& e) {
  return std::accumulate(e.stages.begin(), e.stages.end(), 0,
                         [](int n, const StageEstimate& s) { return n + s.layers; });
}

TEST(EstimateOnDevicesTest, StagesOnFasterDevicesGetMoreLayers) {
  const hal::Topology topology = Example("mixed-generations.yaml");  // 16 H100, then 16 A100
  // t = 2: the layers' arithmetic outweighs their all-reduces, so the peaks decide.
  const ParallelPlan plan = Plan(2, 2, 8, 4);
  Result<DeviceEstimate> sized = EstimateOnDevices(Model(), plan, topology, 32, {});
  ASSERT_TRUE(sized.ok()) << sized.status();
  ASSERT_EQ(sized->stages.size(), 2u);
  EXPECT_EQ(sized->stages[0].device_model, "H100-SXM5-80GB");
  EXPECT_EQ(sized->stages[1].device_model, "A100-SXM4-80GB");
  EXPECT_EQ(Sum(*sized), 24);
  EXPECT_GT(sized->stages[0].layers, 2 * sized->stages[1].layers);  // 3.2x the peak
  // The same plan split evenly: the A100 stage sets the pace, and the step is longer.
  const int even[] = {12, 12};
  Result<DeviceEstimate> split = EstimateOnDevices(Model(), plan, topology, 32, {}, even);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_GT(split->stages[1].micro_batch_s, split->stages[0].micro_batch_s);
  EXPECT_LT(sized->step_time_s, split->step_time_s);
  // The sized split is the one whose slowest stage is fastest.
  for (int first = 1; first < 24; ++first) {
    const int layers[] = {first, 24 - first};
    Result<DeviceEstimate> e = EstimateOnDevices(Model(), plan, topology, 32, {}, layers);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_GE(
        std::max(e->stages[0].micro_batch_s, e->stages[1].micro_batch_s),
        std::max(sized->stages[0].micro_batch_s, sized->stages[1].micro_batch_s) * (1 - 1e-12))
        << first;
  }
}

TEST(EstimateOnDevicesTest, GroupsArePricedOnTheLinksTheirMembersShare) {
  // mixed.yaml: two DGX hosts (NVSwitch 300 GB/s), then two PCIe hosts whose GPUs are joined
  // in NVLink pairs (300 GB/s) and otherwise over PCIe (32 GB/s).
  const hal::Topology topology = Example("mixed.yaml");
  Result<DeviceEstimate> t2 = EstimateOnDevices(Model(), Plan(2, 2, 8, 4), topology, 32, {});
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_DOUBLE_EQ(t2->stages[0].tp_link_bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(t2->stages[1].tp_link_bandwidth, 300e9);  // each pair on its bridge
  Result<DeviceEstimate> t4 = EstimateOnDevices(Model(), Plan(4, 2, 4, 8), topology, 32, {});
  ASSERT_TRUE(t4.ok()) << t4.status();
  EXPECT_DOUBLE_EQ(t4->stages[0].tp_link_bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(t4->stages[1].tp_link_bandwidth, 32e9);  // four GPUs cross the PCIe bridge
  // Data-parallel rings across the PCIe hosts' slower NICs (12.5 GB/s against 25).
  EXPECT_LT(t4->stages[1].dp_link_bandwidth, t4->stages[0].dp_link_bandwidth);
}

TEST(EstimateOnDevicesTest, OnUniformDevicesTheSizedStagesMatchTheEnginesSplit) {
  const hal::Topology topology = Example("dgx-a100x4.yaml");
  Result<PlannerCluster> cluster = ClusterFromTopology(topology);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_FALSE(cluster->mixed);
  const ParallelPlan plan = Plan(2, 4, 4, 8);
  Result<DeviceEstimate> sized = EstimateOnDevices(Model(), plan, topology, 32, {});
  ASSERT_TRUE(sized.ok()) << sized.status();
  Result<std::vector<int>> bounds = BalanceStages(Model(), 4);
  ASSERT_TRUE(bounds.ok()) << bounds.status();
  std::vector<int> engine;
  for (size_t s = 0; s + 1 < bounds->size(); ++s) engine.push_back((*bounds)[s + 1] - (*bounds)[s]);
  Result<DeviceEstimate> balanced = EstimateOnDevices(Model(), plan, topology, 32, {}, engine);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  // The engine balances modelled FLOPs (LayerCosts), the estimate times: within 2%.
  EXPECT_LE(sized->step_time_s, balanced->step_time_s * (1 + 1e-12));
  EXPECT_NEAR(sized->step_time_s, balanced->step_time_s, 0.02 * balanced->step_time_s);
}

TEST(EstimateOnDevicesTest, RejectsAPlanOrASplitThatDoesNotFit) {
  const hal::Topology topology = Example("mixed.yaml");
  EXPECT_EQ(EstimateOnDevices(Model(), Plan(1, 1, 16, 2), topology, 32, {}).status().code(),
            ErrorCode::kInvalidArgument);  // 16 of 32 devices
  const int short_split[] = {10, 10};
  EXPECT_EQ(
      EstimateOnDevices(Model(), Plan(2, 2, 8, 4), topology, 32, {}, short_split).status().code(),
      ErrorCode::kInvalidArgument);
}

TEST(SearchOnDevicesTest, FindsAPlanAtLeastAsFastAsTheHomogeneousChoiceOnTheDevices) {
  const hal::Topology topology = Example("mixed-generations.yaml");
  Result<PlannerCluster> cluster = ClusterFromTopology(topology);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_TRUE(cluster->mixed);
  Result<DeviceSearchResult> r =
      SearchOnDevices(Model(), topology, cluster->spec, 64, {}, cluster->options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->evaluated, 10);
  EXPECT_TRUE(r->best.sized.fits);
  EXPECT_LE(r->best.sized.step_time_s, r->homogeneous.sized.step_time_s * (1 + 1e-12));
  EXPECT_LE(r->best.sized.step_time_s, r->best.balanced.step_time_s * (1 + 1e-12));
  EXPECT_LT(r->best.sized.step_time_s, r->homogeneous.balanced.step_time_s);
}

}  // namespace
}  // namespace kc::parallel::planner
